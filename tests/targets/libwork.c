/* libwork.so: one instrumentable function, called by the workers targets
 * through the PLT. Built with: gcc -O2 -shared -fPIC -o libwork.so libwork.c */
__attribute__((noinline, noipa)) long lib_work(long *counter, long x)
{
    *counter += 1;
    long r = x ^ (x >> 3);
    if (r & 1)
        r += 0x1234;
    return r;
}
