/* Opening an input file that must be a regular file (a config, a token
 * file) without ever blocking: open(2) of a FIFO waits for a writer and of
 * some devices has side effects, so the kind is checked before the open,
 * and again on the descriptor in case the name changed in between. It
 * reports; the caller words the user error. */
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include "dynmo/core.h"

static const char *file_kind(mode_t mode)
{
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "a special file";
}

int dm_open_regular(const char *path, const char **kind)
{
    *kind = NULL;
    struct stat st;
    if (stat(path, &st) != 0) return -1;
    if (!S_ISREG(st.st_mode)) {
        *kind = file_kind(st.st_mode);
        return -1;
    }
    /* O_NONBLOCK changes nothing for a regular file; it only keeps a FIFO
     * swapped in after the stat from blocking the open. */
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    if (fstat(fd, &st) != 0) {
        int saved_errno = errno;
        close(fd);
        errno = saved_errno;
        return -1;
    }
    if (!S_ISREG(st.st_mode)) {
        *kind = file_kind(st.st_mode);
        close(fd);
        return -1;
    }
    return fd;
}
