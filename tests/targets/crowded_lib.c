// The library whose neighbourhood tests/targets/crowded.c fills.
__attribute__((noinline)) long lib_work(long x) { return x * 7 + 3; }
