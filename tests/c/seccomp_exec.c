/* seccomp_exec.c — run a command under the seccomp filter of Android's app sandbox, as far as pi2's I/O cares:
 *   --trap-uring   io_uring_setup -> SECCOMP_RET_TRAP (SIGSYS kills the caller, as Android's filter does)
 *   --kill-uring   io_uring_setup -> SECCOMP_RET_KILL_PROCESS (the calling process dies at once)
 *   --deny-aio     io_setup -> EPERM (a sandbox that refuses Linux AIO)
 * Usage: seccomp_exec [flags] -- CMD ARGS...  The filter is inherited by CMD and every child it forks.
 * Used by tests/test_seccomp.py; x86-64 and aarch64 (the syscall numbers come from the C library's headers). */
#define _GNU_SOURCE
#include <errno.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#ifndef __NR_io_uring_setup
#define __NR_io_uring_setup 425
#endif

int main(int argc, char **argv) {
    int trap = 0, kill = 0, deny_aio = 0, i = 1;
    for (; i < argc && strcmp(argv[i], "--"); i++) {
        if (!strcmp(argv[i], "--trap-uring")) trap = 1;
        else if (!strcmp(argv[i], "--kill-uring")) kill = 1;
        else if (!strcmp(argv[i], "--deny-aio")) deny_aio = 1;
        else { fprintf(stderr, "seccomp_exec: unknown flag %s\n", argv[i]); return 2; }
    }
    if (i + 1 >= argc) { fprintf(stderr, "usage: seccomp_exec [--trap-uring|--kill-uring] [--deny-aio] -- CMD...\n"); return 2; }
    const unsigned uring = kill ? SECCOMP_RET_KILL_PROCESS : trap ? SECCOMP_RET_TRAP : SECCOMP_RET_ALLOW;
    const unsigned aio = deny_aio ? SECCOMP_RET_ERRNO | (EPERM & SECCOMP_RET_DATA) : SECCOMP_RET_ALLOW;
    struct sock_filter f[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, uring),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_setup, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, aio),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {.len = sizeof f / sizeof f[0], .filter = f};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) || prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog)) {
        perror("seccomp_exec: installing the filter");
        return 2;
    }
    execvp(argv[i + 1], argv + i + 1);
    perror("seccomp_exec: exec");
    return 127;
}
