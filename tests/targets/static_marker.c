/* static_marker: linked with -static; main creates the file named by its
 * last argument and prints a line. Under `weft run` neither may happen:
 * weft cannot instrument a static program and must stop it before main.
 *
 * Build: gcc -O2 -static static_marker.c
 * Usage: static_marker MARKER   (also usable as a script interpreter:
 *        the script's path then comes before MARKER)
 */
#include <fcntl.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    if (argc < 2)
        return 2;
    int fd = open(argv[argc - 1], O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0)
        close(fd);
    printf("main ran pid=%d\n", (int)getpid());
    return 0;
}
