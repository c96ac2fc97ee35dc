// A threaded C++ cache service, written the ordinary way, for
// tests/code/clone_names.rs: a class in a namespace with overloaded methods,
// a function template instantiated twice (`app::largest<int>`,
// `app::largest<double>`), and a method gcc -O2 clones: the file's own
// `(anonymous namespace)::Eviction::score` reads two fields of the entry
// it is given and nothing of its object (`….isra.0`).
//
// Usage: cppnames ROUNDS. Each of THREADS threads runs ROUNDS requests
// and prints what it did by its own counters:
//   thread TID get_int=N get_str=N put=N evict=N max_int=N max_double=N sum=N
// (`max_int`, `max_double`: calls of `largest<int>`, `largest<double>`).
#include <pthread.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

namespace app {

static thread_local unsigned long get_ints, get_strs, puts_done, evictions, max_ints,
    max_doubles;

template <typename T> __attribute__((noinline)) T largest(const std::vector<T> &values)
{
    if (sizeof(T) == sizeof(int))
        max_ints++;
    else
        max_doubles++;
    T best = values.empty() ? T() : values[0];
    for (const T &v : values)
        if (best < v)
            best = v;
    return best;
}

struct Entry {
    int key;
    int value;
    long stamp;
    double score;
    std::string label;
};

namespace {

// How much an entry was worth when it leaves the cache (private to this
// file, so gcc may change how it is called).
class Eviction {
public:
    double score(const Entry &e) const;
};

__attribute__((noinline)) double Eviction::score(const Entry &e) const
{
    evictions++;
    double s = e.score;
    for (long i = 0; i < (e.stamp & 7) + 2; i++) {
        if (s > 50.0)
            s = s / 2.0 + static_cast<double>(i);
        else
            s = s * 1.25 + 1.0;
    }
    return s;
}

} // namespace

class Cache {
public:
    explicit Cache(size_t size) : slots_(size) {}
    int get(int key) const;
    int get(const std::string &key) const;
    void put(int key, int value);

    std::vector<double> recent_scores() const;

private:
    std::vector<Entry> slots_;
    long clock_ = 0;
    double evicted_score_ = 0;
};

int Cache::get(int key) const
{
    get_ints++;
    const Entry &e = slots_[static_cast<size_t>(key) % slots_.size()];
    return e.key == key ? e.value : -1;
}

int Cache::get(const std::string &key) const
{
    get_strs++;
    int k = 0;
    for (char c : key)
        k = k * 31 + c;
    const Entry &e = slots_[static_cast<size_t>(k & 0x7fffffff) % slots_.size()];
    return e.label == key ? e.value : -1;
}

std::vector<double> Cache::recent_scores() const
{
    std::vector<double> out;
    for (size_t i = 0; i < slots_.size(); i += 16)
        out.push_back(slots_[i].score);
    return out;
}

void Cache::put(int key, int value)
{
    puts_done++;
    Entry &e = slots_[static_cast<size_t>(key) % slots_.size()];
    if (e.key != 0 && e.key != key)
        evicted_score_ += Eviction().score(e);
    clock_++;
    e.key = key;
    e.value = value;
    e.stamp = clock_;
    e.score = static_cast<double>(value % 97) + evicted_score_ / 1e9;
    if (clock_ % 8 == 0)
        evicted_score_ -= Eviction().score(e);
    e.label = std::to_string(key);
}

} // namespace app

static void *worker(void *arg)
{
    long rounds = reinterpret_cast<long>(arg);
    app::Cache cache(256);
    std::vector<int> recent;
    long sum = 0;
    for (long n = 0; n < rounds; n++) {
        int key = static_cast<int>(n * 7919 % 1000) + 1;
        cache.put(key, static_cast<int>(n));
        sum += cache.get(key);
        if (n % 3 == 0)
            sum += cache.get(std::to_string(key));
        if (n % 10 == 0) {
            recent.push_back(key);
            sum += app::largest(recent);
            sum += static_cast<long>(app::largest(cache.recent_scores()));
        }
    }
    std::printf("thread %d get_int=%lu get_str=%lu put=%lu evict=%lu max_int=%lu "
                "max_double=%lu sum=%ld\n",
                static_cast<int>(gettid()), app::get_ints, app::get_strs, app::puts_done,
                app::evictions, app::max_ints, app::max_doubles, sum);
    return nullptr;
}

int main(int argc, char **argv)
{
    const int threads = 3;
    long rounds = argc > 1 ? std::atol(argv[1]) : 1000;
    pthread_t th[threads];
    for (int i = 0; i < threads; i++)
        pthread_create(&th[i], nullptr, worker, reinterpret_cast<void *>(rounds * (i + 1)));
    for (int i = 0; i < threads; i++)
        pthread_join(th[i], nullptr);
    return 0;
}
