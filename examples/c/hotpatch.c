/* The fixed checksum for examples/hotpatch.rs: the server's own stops one
 * byte early. Same signature; installed with Process::replace_function. */
unsigned checksum_fixed(const char *s, unsigned len)
{
    unsigned sum = 0;
    for (unsigned i = 0; i < len; i++)
        sum = sum * 31 + (unsigned char)s[i];
    return sum;
}
