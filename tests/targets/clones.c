/* A threaded log-record indexer, written the ordinary way, whose helpers
 * gcc -O2 turns into clones (tests/code/clone_names.rs): `weigh` reads two
 * fields of the record it is given (IPA-SRA: `weigh.isra.0`), `scale` is
 * always called with the same factor and returns early for a factor of 0
 * or less (`scale.part.0.constprop.0`), and `lookup` returns early for key
 * 0 (partial inlining: callers test the key themselves and call
 * `lookup.part.0` for the scan). `parse_field` stays itself. With
 * clang -O2 -flto=thin, the table's `hash_key` (clones_table.c) becomes
 * `hash_key.llvm.N` in this file's module.
 *
 * Usage: clones ROUNDS. Each of THREADS threads processes ROUNDS records
 * and prints what it did by its own counters:
 *   thread TID parse_field=N weigh=N scale=N lookup=N lookups=N hash_key=N sum=N
 * (`lookup`: scans, i.e. lookups of a key other than 0; `lookups`: all;
 * `scale`: calls with a factor above 0, all of them).
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "clones_table.h"

#define THREADS 3

struct record {
    int id;
    int kind;
    char text[48];
    int len;
    double weight;
};

static __thread unsigned long parsed, weighed, scaled, scans;

/* Where parsing stands in a record's text. */
struct cursor {
    const char *text;
    int len;
    int base;
};

static int parse_field(const struct cursor *c)
{
    int value = 0, sign = 1, i = 0;
    parsed++;
    while (i < c->len && (c->text[i] == ' ' || c->text[i] == '\t'))
        i++;
    if (i < c->len && (c->text[i] == '-' || c->text[i] == '+')) {
        sign = c->text[i] == '-' ? -1 : 1;
        i++;
    }
    for (; i < c->len; i++) {
        char ch = c->text[i];
        if (ch >= '0' && ch <= '9')
            value = value * c->base + (ch - '0');
        else if (c->base == 16 && ch >= 'a' && ch <= 'f')
            value = value * 16 + (ch - 'a' + 10);
        else if (ch == ',' || ch == ';')
            break;
        else
            return -1;
    }
    return sign * value;
}

static double weigh(const struct record *r)
{
    double w = r->weight;
    weighed++;
    for (int i = 0; i < r->kind + 3; i++) {
        if (w > 100.0)
            w = w / 3.0 + i;
        else
            w = w * 1.5 - i;
        if (w < 0)
            w = -w;
    }
    return w * r->kind;
}

static long scale(long v, int factor)
{
    long out = 0;
    if (factor <= 0)
        return v;
    scaled++;
    for (int i = 0; i < factor % 7 + 3; i++) {
        long part = (v * factor) >> i;
        if (part > 1000000)
            part = 1000000 + part / factor;
        else if (part < -1000000)
            part = -1000000 + part / factor;
        switch ((v + i) & 3) {
        case 0: out += part; break;
        case 1: out -= part / 3; break;
        case 2: out ^= part; break;
        default: out += part % 97; break;
        }
    }
    return out / (factor % 10 + 1);
}

static int lookup(const struct table *t, int key)
{
    if (key == 0)
        return 0;
    scans++;
    int best = -1;
    for (int i = 0; i < TABLE_SIZE; i++) {
        if (t->keys[i] == key) {
            best = i;
            break;
        }
        if (t->keys[i] > key && (best < 0 || t->keys[i] < t->keys[best]))
            best = i;
    }
    return best < 0 ? -1 : t->values[best];
}

/* Every 16 records, the last one is checked again. */
static long checkpoint(const struct table *t, const struct record *last)
{
    struct cursor c = {last->text, last->len, last->kind == 1 ? 16 : 10};
    int field = parse_field(&c);
    return scale(field, 1000) + lookup(t, field % 3 ? field : 0) + (long)weigh(last);
}

static void *worker(void *arg)
{
    long rounds = (long)arg;
    struct table *t = table_new();
    unsigned long lookups = 0;
    long sum = 0;
    for (long n = 0; n < rounds; n++) {
        struct record r = {.id = (int)n, .kind = (int)(n % 3), .weight = (double)(n % 17)};
        r.len = snprintf(r.text, sizeof r.text, "%ld,%ld", n * 7 % 1000, n);
        struct cursor c = {r.text, r.len, r.kind == 2 ? 16 : 10};
        int field = parse_field(&c);
        sum += scale(field, 1000);
        sum += (long)weigh(&r);
        if (n % 5 == 0)
            sum += scale(r.id, 1000);
        int key = (n % 4 == 0) ? 0 : field;
        sum += lookup(t, key);
        lookups++;
        table_put(t, field, (int)n);
        sum += table_find(t, field);
        if (n % 64 == 63)
            table_remove(t, field);
        if (n % 16 == 15) {
            sum += checkpoint(t, &r);
            lookups++;
        }
    }
    printf("thread %d parse_field=%lu weigh=%lu scale=%lu lookup=%lu lookups=%lu hash_key=%lu "
           "sum=%ld\n",
           (int)gettid(), parsed, weighed, scaled, scans, lookups, table_hashes(), sum);
    table_free(t);
    return NULL;
}

int main(int argc, char **argv)
{
    long rounds = argc > 1 ? atol(argv[1]) : 1000;
    pthread_t th[THREADS];
    for (int i = 0; i < THREADS; i++)
        pthread_create(&th[i], NULL, worker, (void *)(rounds * (i + 1)));
    for (int i = 0; i < THREADS; i++)
        pthread_join(th[i], NULL);
    return 0;
}
