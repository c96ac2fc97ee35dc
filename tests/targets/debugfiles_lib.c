/* libdbgwork.so for tests/code/debug_files.rs: dbg_lib_hidden is not exported,
 * so only the library's debug file names it. */
static volatile int lib_sink;

__attribute__((visibility("hidden"), noinline, noclone)) int dbg_lib_hidden(int x) { lib_sink += x; return x - 1; }

int dbg_lib_entry(int x) { return dbg_lib_hidden(x) + 1; }

/* A private copy of the program's dbg_twin (as the dynamic loader has its
 * own strlen): a bare `dbg_twin` means the program's. */
__attribute__((visibility("hidden"), noinline, noclone)) int dbg_twin(int x) { lib_sink -= x; return x; }

#define FILL(n) __attribute__((visibility("hidden"), noinline)) int dbg_lib_filler_##n(int x) { lib_sink += x * n; return lib_sink % (n + 3); }
FILL(1) FILL(2) FILL(3) FILL(4) FILL(5) FILL(6) FILL(7) FILL(8) FILL(9) FILL(10)
FILL(11) FILL(12) FILL(13) FILL(14) FILL(15) FILL(16) FILL(17) FILL(18) FILL(19) FILL(20)

int (*dbg_lib_fillers[])(int) = {
    dbg_lib_filler_1, dbg_lib_filler_2, dbg_lib_filler_3, dbg_lib_filler_4, dbg_lib_filler_5,
    dbg_lib_filler_6, dbg_lib_filler_7, dbg_lib_filler_8, dbg_lib_filler_9, dbg_lib_filler_10,
    dbg_lib_filler_11, dbg_lib_filler_12, dbg_lib_filler_13, dbg_lib_filler_14, dbg_lib_filler_15,
    dbg_lib_filler_16, dbg_lib_filler_17, dbg_lib_filler_18, dbg_lib_filler_19, dbg_lib_filler_20,
    dbg_twin,
};
