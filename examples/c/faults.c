/* The fault injector of examples/faults.rs: installed over malloc with
 * Process::replace_function, it makes malloc return NULL exactly once: at
 * the FAIL_AT-th call made by one thread (the first to get there). Every
 * other call goes to the original malloc, whose address the tool writes
 * into malloc_original. Nothing here may call malloc. */
#include <stddef.h>

void *(*malloc_original)(size_t);
long fail_at = 1000;
/* Set once the failure was injected (the thread that did it). */
long injected;

/* Initial-exec: reading it never allocates (no __tls_get_addr). */
static __thread long calls __attribute__((tls_model("initial-exec")));

void *malloc_faulty(size_t size)
{
    if (++calls == fail_at && __atomic_exchange_n(&injected, 1, __ATOMIC_RELAXED) == 0)
        return NULL;
    return malloc_original(size);
}
