/* bind-loopback.so — LD_PRELOAD'ed into the test cluster's Slurm daemons (slurm-cluster.sh):
 * Debian's Slurm 22.05 listens on every interface whatever slurm.conf says, so a bind() to
 * the wildcard address becomes a bind to loopback (0.0.0.0 -> 127.0.0.1, :: -> ::1).
 *
 *   cc -shared -fPIC -O2 -o bind-loopback.so bind-loopback.c -ldl
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static int (*real_bind)(int, const struct sockaddr *, socklen_t);
    struct sockaddr_in in4;
    struct sockaddr_in6 in6;
    if (!real_bind)
        real_bind = (int (*)(int, const struct sockaddr *, socklen_t))dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof in4) {
        memcpy(&in4, addr, sizeof in4);
        if (in4.sin_addr.s_addr == htonl(INADDR_ANY)) {
            in4.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&in4, sizeof in4);
        }
    } else if (addr && addr->sa_family == AF_INET6 && len >= (socklen_t)sizeof in6) {
        memcpy(&in6, addr, sizeof in6);
        if (!memcmp(&in6.sin6_addr, &in6addr_any, sizeof in6addr_any)) {
            in6.sin6_addr = in6addr_loopback;
            return real_bind(fd, (const struct sockaddr *)&in6, sizeof in6);
        }
    }
    return real_bind(fd, addr, len);
}
