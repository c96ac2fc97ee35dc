/*
 * Constrained metrics and C++ exceptions: a helper (`spin_for`) measured
 * only inside `parse_request`, which exceptions leave in three ways —
 * caught inside it (the frame stays), thrown out of it past a destructor
 * that itself calls the helper (the landing pad runs inside the frame,
 * before the frame goes), and caught by the caller, which then calls the
 * helper outside.
 *
 * Built as users build (g++ and clang++, -O2 -g), threads with default
 * attributes. Each thread keeps its own truth from what the program knows
 * of where each call was made, and prints it after each run.
 *
 * Prints "ready pid=P threads=T", then reads commands from stdin:
 *   go N   each worker runs N rounds; prints one line per worker
 *          "truth tid=T spins=C spin_in_parse=C spin_in_parse_cpu=NS
 *           parse=C throws=C"
 *          then "done"
 *   quit   exits
 */
#include <pthread.h>
#include <stdexcept>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>

#ifdef __clang__
#define NOINLINE __attribute__((noinline))
#else
#define NOINLINE __attribute__((noinline, noipa))
#endif

static thread_local int in_parse;
static thread_local long spins, spin_in_parse, parses, throws;
static thread_local long long spin_in_parse_cpu;
static volatile unsigned long sink;

static long long thread_cpu_ns() {
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

extern "C" NOINLINE void spin_for(long ns) {
    long long t0 = thread_cpu_ns(), t;
    do {
        for (int i = 0; i < 200; i++)
            sink += i;
        t = thread_cpu_ns();
    } while (t - t0 < ns);
    spins++;
    if (in_parse) {
        spin_in_parse++;
        spin_in_parse_cpu += t - t0;
    }
}

/* Raised for the whole of parse_request's frame: lowered by its
 * destructor, the last thing an unwind runs in that frame. */
struct InParse {
    InParse() { in_parse++; }
    ~InParse() { in_parse--; }
};

/* Destroyed before InParse: its destructor's spin is inside the frame,
 * also when an exception passes. */
struct Flush {
    ~Flush() { spin_for(10000); }
};

extern "C" NOINLINE void fail_deep(int round) {
    spin_for(20000);
    if (round % 3 == 1) {
        throws++;
        throw std::runtime_error("bad request");
    }
    if (round % 5 == 2)
        throw 7; /* caught inside parse_request */
}

extern "C" NOINLINE void parse_request(int round) {
    InParse inside;
    Flush flush;
    parses++;
    spin_for(150000);
    try {
        fail_deep(round);
    } catch (int) {
        spin_for(5000);
    }
    spin_for(50000);
}

extern "C" NOINLINE void guarded_parse(int round) {
    try {
        parse_request(round);
    } catch (const std::exception &) {
        /* Out of parse_request by its exception: no longer inside it. */
        spin_for(30000);
    }
}

extern "C" NOINLINE void log_line() { spin_for(60000); }

static int rounds_asked;
static pthread_barrier_t start_line, finish_line;

static void *worker(void *) {
    for (;;) {
        pthread_barrier_wait(&start_line);
        spins = spin_in_parse = parses = throws = 0;
        spin_in_parse_cpu = 0;
        for (int r = 0; r < rounds_asked; r++) {
            guarded_parse(r);
            log_line();
        }
        flockfile(stdout);
        printf("truth tid=%d spins=%ld spin_in_parse=%ld spin_in_parse_cpu=%lld parse=%ld "
               "throws=%ld\n",
               gettid(), spins, spin_in_parse, spin_in_parse_cpu, parses, throws);
        funlockfile(stdout);
        pthread_barrier_wait(&finish_line);
    }
    return nullptr;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 3;
    setvbuf(stdout, nullptr, _IOLBF, 0);
    pthread_barrier_init(&start_line, nullptr, n + 1);
    pthread_barrier_init(&finish_line, nullptr, n + 1);
    for (int i = 0; i < n; i++) {
        pthread_t t;
        if (pthread_create(&t, nullptr, worker, nullptr) != 0)
            return 1;
    }
    printf("ready pid=%d threads=%d\n", getpid(), n + 1);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {
        if (!strncmp(line, "go ", 3)) {
            rounds_asked = atoi(line + 3);
            pthread_barrier_wait(&start_line);
            pthread_barrier_wait(&finish_line);
            printf("done\n");
        } else if (!strncmp(line, "quit", 4)) {
            return 0;
        }
    }
    return 0;
}
