/* A small open-addressing table for clones.c. `hash_key` is private to
 * this file; with clang -O2 -flto=thin the small `table_put` and
 * `table_find` are imported into clones.c's module, so `hash_key` is
 * promoted to a global `hash_key.llvm.N` that both modules call. */
#include <stdlib.h>

#include "clones_table.h"

static __thread unsigned long hashes;

/* Out of line: one copy for every table operation, in both modules. */
static __attribute__((noinline)) unsigned hash_key(int key)
{
    unsigned h = 2166136261u;
    hashes++;
    for (int i = 0; i < 4; i++) {
        h ^= (unsigned)(key >> (i * 8)) & 0xff;
        h *= 16777619u;
    }
    /* Mix the high bits down, as murmur's finaliser does. */
    h ^= h >> 16;
    h *= 0x85ebca6bu;
    h ^= h >> 13;
    h *= 0xc2b2ae35u;
    h ^= h >> 16;
    return h % TABLE_SIZE;
}

struct table *table_new(void)
{
    return calloc(1, sizeof(struct table));
}

void table_free(struct table *t)
{
    free(t);
}

void table_put(struct table *t, int key, int value)
{
    unsigned h = hash_key(key);
    t->keys[h] = key;
    t->values[h] = value;
}

int table_find(const struct table *t, int key)
{
    unsigned h = hash_key(key);
    return t->keys[h] == key ? t->values[h] : -1;
}

int table_remove(struct table *t, int key)
{
    unsigned h = hash_key(key);
    if (t->keys[h] != key)
        return 0;
    t->keys[h] = 0;
    return 1;
}

unsigned long table_hashes(void)
{
    return hashes;
}
