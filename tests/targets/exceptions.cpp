// exceptions: C++ exceptions propagating through instrumented frames.
//
// Build: g++ -O2 -pthread exceptions.cpp
// Usage: exceptions [ROUNDS]          (default 1000; rounded up to even)
//
// Instrumented-by-the-tests functions (extern "C", so their ELF symbols are
// plainly `thrower` and `middle`; noinline, noipa):
//   thrower(i)   throws std::runtime_error when i is even, else returns
//   middle(i)    holds a Guard (destructor counts, so middle has a cleanup
//                landing pad) and calls thrower (not a tail call)
// outer (not instrumented) calls middle inside try/catch.
//
// WORKERS threads (named "worker-i") each run ROUNDS rounds: round r calls outer(r), so rounds
// alternate throwing (even r) and not throwing (odd r), ending with a round
// that does not throw; after each catch it sleeps 200 us. Each thread
// measures the whole loop, and the time spent inside middle() (up to its
// return or the catch), with CLOCK_MONOTONIC.
//
// Output on stdout is deterministic:
//   {"worker":i,"rounds":R,"thrower":N,"middle":N,"throws":T,"catches":C,
//    "dtors":D,"checksum":S,"ok":true}          per worker, in index order
//   done
// On stderr: "tid role=worker index=i tid=T loop_wall_ns=W middle_wall_ns=M"
// per worker.
// Exit 0, or 1 if a self-check failed.
#include <pthread.h>
#include <stdexcept>
#include <string>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>

static const int WORKERS = 2;

struct Counts {
    long thrower = 0, middle = 0, throws = 0, dtors = 0;
};
static thread_local Counts cnt;

struct Guard {
    long *dtors;
    long value;
    explicit Guard(long *d, long v) : dtors(d), value(v) {}
    ~Guard() { *dtors += 1; }
};

extern "C" __attribute__((noinline, noipa)) long thrower(int i)
{
    cnt.thrower++;
    if (i % 2 == 0) {
        cnt.throws++;
        throw std::runtime_error("thrown in round " + std::to_string(i));
    }
    return (long)i * 3 + 1;
}

extern "C" __attribute__((noinline, noipa)) long middle(int i)
{
    cnt.middle++;
    Guard g(&cnt.dtors, i);
    long r = thrower(i);
    return r + g.value;
}

static long now_ns()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1000000000L + ts.tv_nsec;
}

// Time this thread spent inside middle(): from the call to its return or to
// the start of the handler that caught its exception.
static thread_local long middle_ns;

static __attribute__((noinline)) long outer(int i, long *catches)
{
    long t0 = now_ns();
    try {
        long r = middle(i);
        middle_ns += now_ns() - t0;
        return r;
    } catch (const std::runtime_error &e) {
        middle_ns += now_ns() - t0;
        *catches += 1;
        // Idle after the catch, outside every instrumented function: a
        // timer that stayed open until the next call would count this.
        struct timespec pause = {0, 200000};
        nanosleep(&pause, nullptr);
        return (long)std::strlen(e.what());
    }
}

struct WState {
    pthread_t th;
    int index;
    long rounds;
    Counts counts;
    long catches;
    unsigned long checksum;
    long loop_wall_ns;
    bool ok;
};

static void *worker(void *arg)
{
    WState *w = static_cast<WState *>(arg);
    int tid = (int)syscall(SYS_gettid);
    char name[16];
    std::snprintf(name, sizeof name, "worker-%d", w->index);
    pthread_setname_np(pthread_self(), name);
    unsigned long sum = 0, ref = 0;
    long catches = 0;
    long t0 = now_ns();
    for (long r = 0; r < w->rounds; r++)
        sum = sum * 31 + (unsigned long)outer((int)r, &catches);
    long t1 = now_ns();
    for (long r = 0; r < w->rounds; r++) {
        long v = r % 2 == 0 ? (long)std::strlen(("thrown in round " + std::to_string(r)).c_str())
                            : r * 3 + 1 + r;
        ref = ref * 31 + (unsigned long)v;
    }
    w->counts = cnt;
    w->catches = catches;
    w->checksum = sum;
    w->loop_wall_ns = t1 - t0;
    long throws = (w->rounds + 1) / 2;
    w->ok = sum == ref && cnt.thrower == w->rounds && cnt.middle == w->rounds &&
            cnt.throws == throws && catches == throws && cnt.dtors == w->rounds;
    std::fprintf(stderr, "tid role=worker index=%d tid=%d loop_wall_ns=%ld middle_wall_ns=%ld\n",
                 w->index, tid, w->loop_wall_ns, middle_ns);
    return nullptr;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? std::atol(argv[1]) : 1000;
    if (argc > 2 || rounds < 2) {
        std::fprintf(stderr, "usage: exceptions [ROUNDS >= 2]\n");
        return 64;
    }
    rounds += rounds % 2; // the last round (odd) does not throw
    static WState ws[WORKERS];
    for (int i = 0; i < WORKERS; i++) {
        ws[i].index = i;
        ws[i].rounds = rounds;
        if (pthread_create(&ws[i].th, nullptr, worker, &ws[i]) != 0)
            return 1;
    }
    for (int i = 0; i < WORKERS; i++)
        pthread_join(ws[i].th, nullptr);
    bool ok = true;
    for (int i = 0; i < WORKERS; i++) {
        const WState &w = ws[i];
        std::printf("{\"worker\":%d,\"rounds\":%ld,\"thrower\":%ld,\"middle\":%ld,\"throws\":%ld,"
                    "\"catches\":%ld,\"dtors\":%ld,\"checksum\":%lu,\"ok\":%s}\n",
                    i, w.rounds, w.counts.thrower, w.counts.middle, w.counts.throws, w.catches,
                    w.counts.dtors, w.checksum, w.ok ? "true" : "false");
        ok = ok && w.ok;
    }
    std::printf("done\n");
    std::fflush(stdout);
    return ok ? 0 : 1;
}
