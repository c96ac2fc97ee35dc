/* The table of clones.c, in a file of its own (see clones_table.c). */
#define TABLE_SIZE 64

struct table {
    int keys[TABLE_SIZE];
    int values[TABLE_SIZE];
};

struct table *table_new(void);
void table_free(struct table *t);
void table_put(struct table *t, int key, int value);
int table_find(const struct table *t, int key);
int table_remove(struct table *t, int key);
unsigned long table_hashes(void);
