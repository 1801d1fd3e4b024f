/* The MPI world (include/dynmo/world.h): start-up, the hooks that make
 * core's fatal path abort the whole job (STYLE.md: no rank is left waiting
 * on a dead peer), polled waits and collectives, processor sharing and
 * turns. It uses only core; nothing here knows of stages or models beyond
 * the counts it is given. */
#define _GNU_SOURCE
#include <mpi.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include "dynmo/core.h"
#include "dynmo/world.h"

static int started;
static int local_size = 1, local_rank;

/* Where each rank of the job runs: its node (the world rank of the node's
 * first rank) and the CPUs it may use. Gathered once at start-up. */
struct placement {
    int node;
    unsigned char cpus[sizeof(cpu_set_t)];
};
static struct placement *placed;   /* (world size) */
static int oversubscribed;         /* this rank shares its CPUs with more ranks than they hold */
static int cpus_for_rank = 1;      /* its CPUs divided by the ranks that may run on them */
static MPI_Comm node_comm = MPI_COMM_NULL;  /* the ranks of this node */

/* Turns (world_compute_begin): the ranks of a node whose CPU sets overlap
 * form a turn group; at most `permits` (the CPUs of the group) of them
 * compute at once, admitted in the order they asked (a ticket lock with
 * several holders). One struct per group in memory the node shares. */
struct turn_group {
    _Atomic uint32_t next;      /* tickets handed out */
    _Atomic uint32_t served;    /* computations finished; futex word */
    uint32_t permits;
    char pad[64 - 3 * sizeof(uint32_t)];
};
static struct turn_group *turn_groups;  /* (local_size) mapped, or NULL */
static struct turn_group *my_turns;     /* this rank's group when it takes turns */
static size_t turn_bytes;
static uint32_t my_ticket;
static int holding;                     /* this rank holds a turn (world_compute_begin) */
static int turns_on;                    /* the job takes turns (setup_turns) */

static void abort_job(int status)
{
    int initialized = 0, finalized = 0;
    MPI_Initialized(&initialized);
    MPI_Finalized(&finalized);
    if (initialized && !finalized && dm_world_size() > 1) MPI_Abort(MPI_COMM_WORLD, status);
}

static void finalize_job(void)
{
    world_finalize(DM_EXIT_USAGE);
}

static int cpus_overlap(const struct placement *a, const struct placement *b)
{
    if (a->node != b->node) return 0;
    for (size_t i = 0; i < sizeof a->cpus; i++)
        if (a->cpus[i] & b->cpus[i]) return 1;
    return 0;
}

static int cpu_count(const unsigned char *cpus)
{
    int n = 0;
    for (size_t i = 0; i < sizeof(cpu_set_t); i++) n += __builtin_popcount(cpus[i]);
    return n;
}

/* Collective: every rank learns every rank's placement; this rank is
 * oversubscribed when more ranks of its node may run on its CPUs than it
 * has CPUs. Polled like every other collective. */
static void gather_placement(MPI_Comm node, int rank, int size)
{
    struct placement mine;
    memset(&mine, 0, sizeof mine);
    mine.node = rank;
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(&mine.node, 1, MPI_INT, 0, node, &req));
    world_wait(&req);
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0)
        for (int c = 0; c < CPU_SETSIZE; c++) CPU_SET(c, &cpus);
    memcpy(mine.cpus, &cpus, sizeof mine.cpus);
    if (!placed) placed = dm_alloc((size_t)size * sizeof *placed);
    WORLD_MPI(MPI_Iallgather(&mine, (int)sizeof mine, MPI_BYTE, placed, (int)sizeof mine, MPI_BYTE,
                       MPI_COMM_WORLD, &req));
    world_wait(&req);
    int sharing = 0;
    for (int r = 0; r < size; r++) sharing += cpus_overlap(&placed[r], &mine);
    oversubscribed = sharing > cpu_count(mine.cpus);
    cpus_for_rank = sharing > 0 && cpu_count(mine.cpus) / sharing > 1
                        ? cpu_count(mine.cpus) / sharing : 1;
}

static long futex(_Atomic uint32_t *word, int op, uint32_t value, const struct timespec *timeout)
{
    return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

/* This rank's turn group: the ranks of its node whose CPU sets overlap,
 * transitively. Gives the node's rank count (*n), the group's lowest local
 * index (*root), this rank's local index (*mine), its position among the
 * group's members in rank order (*index), their number (*members) and the
 * union of their CPUs (all). */
static void turn_group_of(int rank, int size, int *n, int *root, int *mine, int *index,
                          int *members, unsigned char *all)
{
    const struct placement *me = &placed[rank];
    int *local = dm_alloc((size_t)size * sizeof(int));
    *n = 0;
    for (int r = 0; r < size; r++)
        if (placed[r].node == me->node) local[(*n)++] = r;
    int *parent = dm_alloc((size_t)*n * sizeof(int));
    for (int i = 0; i < *n; i++) parent[i] = i;
    for (int a = 0; a < *n; a++)
        for (int b = a + 1; b < *n; b++)
            if (cpus_overlap(&placed[local[a]], &placed[local[b]])) {
                int ra = a, rb = b;
                while (parent[ra] != ra) ra = parent[ra];
                while (parent[rb] != rb) rb = parent[rb];
                if (ra != rb) parent[ra > rb ? ra : rb] = ra < rb ? ra : rb;
            }
    for (*mine = 0; local[*mine] != rank;) (*mine)++;
    for (*root = *mine; parent[*root] != *root;) *root = parent[*root];
    memset(all, 0, sizeof(cpu_set_t));
    *members = 0;
    for (int i = 0; i < *n; i++) {
        int r = i;
        while (parent[r] != r) r = parent[r];
        if (r != *root) continue;
        if (i == *mine) *index = *members;
        (*members)++;
        for (size_t k = 0; k < sizeof(cpu_set_t); k++) all[k] |= placed[local[i]].cpus[k];
    }
    dm_free(parent);
    dm_free(local);
}

/* The pinning half of setup_turns: ranks of a group with more ranks than
 * CPUs (unbound) pin themselves round robin, and every rank learns the
 * new placements. Fills this rank's turn group (turn_group_of). Returns 0,
 * or -1 when some rank cannot pin itself (then none stays pinned, and rank
 * 0 has warned). Collective. */
static int pin_round_robin(MPI_Comm node, int rank, int size, int *n, int *root, int *mine,
                           int *members, unsigned char *all)
{
    int index = 0;
    turn_group_of(rank, size, n, root, mine, &index, members, all);
    int pin = *members > cpu_count(all) && cpu_count(all) > 1, cpu = -1;
    cpu_set_t before;
    CPU_ZERO(&before);
    if (pin && sched_getaffinity(0, sizeof before, &before) != 0) pin = -1;
    if (pin > 0) {
        for (int c = 0, k = 0; c < (int)(8 * sizeof(cpu_set_t)); c++)
            if ((all[c / 8] >> (c % 8) & 1) && k++ == index % cpu_count(all)) cpu = c;
        cpu_set_t one;
        CPU_ZERO(&one);
        CPU_SET(cpu, &one);
        if (sched_setaffinity(0, sizeof one, &one) != 0) pin = -1;
    }
    char why[256] = "", agreed[256];
    if (pin < 0)
        snprintf(why, sizeof why, "rank %d cannot pin itself to CPU %d: %s", rank, cpu,
                 dm_errno_text());
    if (world_agree(pin < 0, why, MPI_COMM_WORLD, agreed, sizeof agreed)) {
        if (pin > 0) sched_setaffinity(0, sizeof before, &before);   /* as it was */
        if (rank == 0) dm_warn("ranks do not take turns: %s\n", agreed);
        return -1;
    }
    int any_pinned = 0;
    MPI_Request req;
    WORLD_MPI(MPI_Iallreduce(&pin, &any_pinned, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req));
    world_wait(&req);
    if (any_pinned) {
        gather_placement(node, rank, size);
        turn_group_of(rank, size, n, root, mine, &index, members, all);
        if (rank == 0)
            dm_log("processors: ranks that shared CPUs unpinned are pinned one to a CPU, "
                   "round robin, to take turns (parallel.turns)\n");
    }
    return 0;
}

/* The node's first rank creates `bytes` of POSIX shared memory; every
 * rank maps it. Returns the mapping, or NULL on every rank when any rank
 * cannot (no /dev/shm; rank 0 has warned). Collective. */
static void *map_turn_memory(MPI_Comm node, int rank, size_t bytes)
{
    int node_rank = 0;
    WORLD_MPI(MPI_Comm_rank(node, &node_rank));
    char name[64], problem[256] = "", agreed[256];
    snprintf(name, sizeof name, "/dynmo-turns-%ld-%d", (long)getpid(), rank);
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(name, (int)sizeof name, MPI_CHAR, 0, node, &req));
    world_wait(&req);
    int fd = -1, created = 0;
    if (node_rank == 0) {
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        created = fd >= 0;
        if (fd >= 0 && ftruncate(fd, (off_t)bytes) != 0) {
            close(fd);
            fd = -1;
        }
    }
    WORLD_MPI(MPI_Ibarrier(node, &req));
    world_wait(&req);
    if (node_rank != 0) fd = shm_open(name, O_RDWR, 0600);
    void *base = fd >= 0 ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                         : MAP_FAILED;
    if (base == MAP_FAILED)
        snprintf(problem, sizeof problem, "shared memory %s: %s", name, dm_errno_text());
    if (fd >= 0) close(fd);
    int failed = world_agree(base == MAP_FAILED, problem, MPI_COMM_WORLD, agreed,
                             sizeof agreed);
    if (created) shm_unlink(name);   /* every rank has mapped it, or none will */
    if (!failed) return base;
    if (base != MAP_FAILED) munmap(base, bytes);
    if (rank == 0) dm_warn("ranks do not take turns: %s\n", agreed);
    return NULL;
}

/* Collective over the job. Ranks that may each run on any of several CPUs
 * they share with more ranks (unbound, `mpiexec -n 4` on 2 cores) first pin
 * themselves one to a CPU, round robin over the group's CPUs in rank order
 * (what `mpiexec -bind-to rr` gives), and every rank learns the new
 * placements: taking turns where the OS, not dynmo, chose the CPU of the
 * rank whose turn it was left CPUs idle (docs/pipeline.md). Then every
 * group sharing CPUs has one CPU; maps the node's turn groups (the node's
 * first rank creates them in POSIX shared memory) and points my_turns at
 * this rank's group when it has more ranks than its CPU. Polled. */
static void setup_turns(MPI_Comm node, int rank, int size)
{
    if (turn_groups) return;
    unsigned char all[sizeof(cpu_set_t)];
    int n, root, mine, members;
    if (pin_round_robin(node, rank, size, &n, &root, &mine, &members, all) != 0) return;
    int permits = cpu_count(all);
    DM_ASSERT(members <= permits || permits == 1);
    size_t bytes = (size_t)n * sizeof(struct turn_group);
    struct turn_group *base = map_turn_memory(node, rank, bytes);
    if (!base) return;
    turn_groups = base;
    turn_bytes = bytes;
    if (root == mine) turn_groups[root].permits = (uint32_t)permits;
    MPI_Request req;
    WORLD_MPI(MPI_Ibarrier(node, &req));
    world_wait(&req);
    if (members > permits) my_turns = &turn_groups[root];
    turns_on = 1;
}

int world_take_turns(void)
{
    DM_ASSERT(started && node_comm != MPI_COMM_NULL);
    setup_turns(node_comm, dm_rank(), dm_world_size());
    return turns_on;
}

void world_release_turn(void)
{
    if (!holding) return;
    holding = 0;
    atomic_fetch_add(&my_turns->served, 1);
    futex(&my_turns->served, FUTEX_WAKE, INT_MAX, NULL);
}

void world_compute_begin(void)
{
    if (!my_turns) return;
    world_release_turn();
    my_ticket = atomic_fetch_add(&my_turns->next, 1);
    for (;;) {
        uint32_t served = atomic_load(&my_turns->served);
        /* Tickets before mine are admissible whenever mine is, so at most
         * `permits` are inside; with several permits a later ticket may
         * finish first and `served` pass mine: hence the signed difference. */
        if ((int32_t)(my_ticket - served) < (int32_t)my_turns->permits) break;
        struct timespec wait = {0, 20 * 1000 * 1000};
        futex(&my_turns->served, FUTEX_WAIT, served, &wait);
    }
    holding = 1;
}

/* The node's message gate (dm_set_message_gate): one int in POSIX shared
 * memory that the first rank to fail sets, so that its node prints one
 * message however many of its ranks fail at once. */
static _Atomic int *message_gate;

static int take_message_gate(void)
{
    return !message_gate || atomic_exchange(message_gate, 1) == 0;
}

/* Collective over the node: its first rank creates the gate, every rank
 * maps it. Where that fails, every rank prints its own message. */
static void setup_message_gate(MPI_Comm node, int node_size)
{
    if (node_size < 2) return;
    int node_rank = 0;
    WORLD_MPI(MPI_Comm_rank(node, &node_rank));
    char name[64];
    snprintf(name, sizeof name, "/dynmo-gate-%ld", (long)getpid());
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(name, (int)sizeof name, MPI_CHAR, 0, node, &req));
    world_wait(&req);
    int fd = -1;
    if (node_rank == 0) {
        fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL, 0600);
        if (fd >= 0 && ftruncate(fd, (off_t)sizeof(int)) != 0) {
            close(fd);
            shm_unlink(name);
            fd = -1;
        }
    }
    WORLD_MPI(MPI_Ibarrier(node, &req));
    world_wait(&req);
    if (node_rank != 0) fd = shm_open(name, O_RDWR, 0600);
    void *base = fd >= 0 ? mmap(NULL, sizeof(int), PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                         : MAP_FAILED;
    if (fd >= 0) close(fd);
    WORLD_MPI(MPI_Ibarrier(node, &req));
    world_wait(&req);
    if (node_rank == 0) shm_unlink(name);
    if (base == MAP_FAILED) return;
    message_gate = base;
    dm_set_message_gate(take_message_gate);
}

/* A bounded MPI_Finalize. The transport's shutdown can wait forever on a
 * peer that has moved on (MPICH's UCX over tcp did, about once in 15
 * two-rank runs); by then the run's files are complete, so a rank whose
 * MPI_Finalize has not returned within DYNMO_FINALIZE_SECONDS (default
 * 60; 0 waits forever) says so and exits with the status it was about to
 * return, instead of holding the allocation until its time limit. */
static char finalize_message[160];
static int finalize_status;

static void finalize_overdue(int sig)
{
    (void)sig;
    ssize_t written = write(STDERR_FILENO, finalize_message, strlen(finalize_message));
    (void)written;
    _exit(finalize_status);
}

static unsigned finalize_limit = 60;

/* At start-up, so that a bad value stops the job before it trains. */
static void read_finalize_limit(void)
{
    const char *text = getenv("DYNMO_FINALIZE_SECONDS");
    if (!text) return;
    char *end = NULL;
    long v = strtol(text, &end, 10);
    if (!*text || *end || v < 0 || v > 86400)
        dm_user_error("DYNMO_FINALIZE_SECONDS=%s: want whole seconds in 0..86400 (0: no bound)\n",
                      text);
    finalize_limit = (unsigned)v;
}

static void arm_finalize_limit(int status)
{
    unsigned seconds = finalize_limit;
    if (!seconds) return;
    finalize_status = status;
    snprintf(finalize_message, sizeof finalize_message,
             "[rank %d] MPI_Finalize did not return within %u s; exiting %d "
             "(the run's files are complete)\n", dm_rank(), seconds, status);
    struct sigaction act;
    memset(&act, 0, sizeof act);
    act.sa_handler = finalize_overdue;
    sigemptyset(&act.sa_mask);
    sigaction(SIGALRM, &act, NULL);
    alarm(seconds);
}

/* DYNMO_TEST_MPI_FAULT=finalize (tests only; world.h): the last rank never
 * reaches MPI_Finalize, so every rank's bound is what ends the job. */
static void inject_finalize_fault(void)
{
    const char *fault = getenv("DYNMO_TEST_MPI_FAULT");
    if (!fault || strcmp(fault, "finalize") || dm_rank() != dm_world_size() - 1) return;
    for (;;) pause();
}

/* DYNMO_TEST_MPI_FAULT=send (tests only; world.h): the last rank sends
 * to rank `size`, which does not exist, so that MPI returns an error. */
static void inject_test_fault(int rank, int size)
{
    const char *fault = getenv("DYNMO_TEST_MPI_FAULT");
    if (!fault || strcmp(fault, "send") || rank != size - 1) return;
    int payload = 0;
    MPI_Request req;
    WORLD_MPI(MPI_Isend(&payload, 1, MPI_INT, size, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
}

void world_init(int *argc, char ***argv)
{
    if (started) return;
    int provided = 0, rank = 0, size = 1;
    if (MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided) != MPI_SUCCESS) {
        fprintf(stderr, "dynmo: error: MPI_Init_thread failed\n");
        exit(DM_EXIT_INTERNAL);
    }
    started = 1;
    /* Errors come back to WORLD_MPI, which names the call and the rank,
     * instead of aborting inside MPICH; communicators split from the world
     * inherit this. */
    if (MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN) != MPI_SUCCESS) {
        fprintf(stderr, "dynmo: error: MPI_Comm_set_errhandler failed\n");
        exit(DM_EXIT_INTERNAL);
    }
    WORLD_MPI(MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    WORLD_MPI(MPI_Comm_size(MPI_COMM_WORLD, &size));
    dm_set_rank(rank, size);
    dm_set_abort_hook(abort_job);
    dm_set_finalize_hook(finalize_job);
    read_finalize_limit();
    MPI_Comm node;
    WORLD_MPI(MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                  &node));
    WORLD_MPI(MPI_Comm_size(node, &local_size));
    WORLD_MPI(MPI_Comm_rank(node, &local_rank));
    gather_placement(node, rank, size);
    node_comm = node;
    setup_message_gate(node, local_size);
    if (oversubscribed) {
        /* Waiting ranks sleep (world_wait_round) and must not preempt the rank
         * computing on their core when they wake: SCHED_BATCH turns off
         * wake-up preemption; the small timer slack makes the sleeps short. */
        struct sched_param none = {0};
        if (sched_setscheduler(0, SCHED_BATCH, &none) != 0)
            dm_warn("sched_setscheduler(SCHED_BATCH): %s\n", dm_errno_text());
        prctl(PR_SET_TIMERSLACK, 1000UL);
    }
    inject_test_fault(rank, size);
}

void world_finalize(int status)
{
    int finalized = 0;
    if (!started) return;
    dm_free(placed);
    placed = NULL;
    if (my_turns) world_release_turn();
    if (turn_groups) munmap(turn_groups, turn_bytes);
    if (message_gate) {
        dm_set_message_gate(NULL);
        munmap((void *)message_gate, sizeof(int));
        message_gate = NULL;
    }
    turn_groups = my_turns = NULL;
    MPI_Finalized(&finalized);
    if (finalized) return;
    if (node_comm != MPI_COMM_NULL) MPI_Comm_free(&node_comm);
    fflush(stdout);
    fflush(stderr);
    /* The ranks meet first (a polled barrier, itself under the bound), so
     * that all start their bound on MPI_Finalize together and, if it
     * hangs, all exit with the run's status at about the same moment.
     * Without it a rank that entered early timed out first, and mpiexec
     * killed ranks still inside their bound (exit 9, not the run's
     * status; t_world's 3-rank case, about 1 run in 2). */
    arm_finalize_limit(status);
    MPI_Request met;
    if (MPI_Ibarrier(MPI_COMM_WORLD, &met) == MPI_SUCCESS) world_wait(&met);
    arm_finalize_limit(status);
    inject_finalize_fault();
    MPI_Finalize();
    alarm(0);
}

int world_cpus_for_rank(void) { return cpus_for_rank; }

int world_local_size(void) { return local_size; }

int world_local_rank(void) { return local_rank; }

int world_devices_distinct(const char *id)
{
    enum { ID = 64 };
    int shared = !id || !*id;
    if (!shared && local_size > 1) {
        char mine[ID] = "";
        snprintf(mine, sizeof mine, "%s", id);
        char *all = dm_alloc((size_t)local_size * ID);
        MPI_Request req;
        WORLD_MPI(MPI_Iallgather(mine, ID, MPI_CHAR, all, ID, MPI_CHAR, node_comm, &req));
        world_wait(&req);
        for (int r = 0; r < local_size && !shared; r++)
            shared = r != local_rank && !strncmp(all + (size_t)r * ID, mine, ID);
        dm_free(all);
    }
    return !world_max_int(shared);
}

static int find_root(int *parent, int i)
{
    while (parent[i] != i) i = parent[i] = parent[parent[i]];
    return i;
}

int world_stage_sharing(int stages, int *group, double *cores)
{
    int S = stages, P = dm_world_size();
    DM_ASSERT(placed && S >= 1 && S <= P);
    /* Stages of replica 0 (ranks 0..S-1) on one node with overlapping CPUs
     * share them: union-find over the pairs. */
    int *parent = dm_alloc((size_t)S * sizeof(int));
    for (int s = 0; s < S; s++) parent[s] = s;
    for (int a = 0; a < S; a++)
        for (int b = a + 1; b < S; b++)
            if (cpus_overlap(&placed[a], &placed[b]))
                parent[find_root(parent, b)] = find_root(parent, a);
    int groups = 0, shared = 0;
    for (int s = 0; s < S; s++) group[s] = -1;
    for (int s = 0; s < S; s++) {
        if (group[s] >= 0) continue;
        int root = find_root(parent, s), members = 0;
        struct placement all;
        memset(&all, 0, sizeof all);
        all.node = placed[s].node;
        for (int t = s; t < S; t++) {
            if (find_root(parent, t) != root) continue;
            group[t] = groups;
            members++;
            for (size_t i = 0; i < sizeof all.cpus; i++) all.cpus[i] |= placed[t].cpus[i];
        }
        /* Every rank of the job that may run there takes its share, other
         * replicas' stages included. */
        int ranks = 0, ncpu = cpu_count(all.cpus);
        for (int r = 0; r < P; r++) ranks += cpus_overlap(&placed[r], &all);
        cores[groups] = ranks > ncpu ? (double)ncpu * members / ranks : (double)members;
        shared |= cores[groups] < members;
        groups++;
    }
    dm_free(parent);
    return shared ? groups : 0;
}

int world_agree(int code, const char *message, MPI_Comm comm, char *err, size_t errsize)
{
    int rank, size;
    WORLD_MPI(MPI_Comm_rank(comm, &rank));
    WORLD_MPI(MPI_Comm_size(comm, &size));
    int mine = code ? rank : size, lowest = size;
    MPI_Request request;
    WORLD_MPI(MPI_Iallreduce(&mine, &lowest, 1, MPI_INT, MPI_MIN, comm, &request));
    world_wait(&request);
    if (lowest == size) return 0;
    struct {
        int code;
        char message[WORLD_MESSAGE_BYTES];
    } agreed;
    memset(&agreed, 0, sizeof agreed);
    if (rank == lowest) {
        agreed.code = code;
        snprintf(agreed.message, sizeof agreed.message, "%s", message ? message : "");
    }
    WORLD_MPI(MPI_Ibcast(&agreed, (int)sizeof agreed, MPI_BYTE, lowest, comm, &request));
    world_wait(&request);
    if (err && errsize) snprintf(err, errsize, "%s", agreed.message);
    return agreed.code;
}

void world_bcast_ints(int *buf, int n)
{
    if (dm_world_size() == 1) return;
    MPI_Request req;
    WORLD_MPI(MPI_Ibcast(buf, n, MPI_INT, 0, MPI_COMM_WORLD, &req));
    world_wait(&req);
}


int world_max_int(int value)
{
    if (dm_world_size() == 1) return value;
    int largest = value;
    MPI_Request req;
    WORLD_MPI(MPI_Iallreduce(&value, &largest, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD, &req));
    world_wait(&req);
    return largest;
}

double world_transfer_rate(size_t bytes, int reps)
{
    int rank = dm_rank();
    if (rank > 1) return 0.0;
    char *buf = dm_alloc(bytes);
    memset(buf, rank + 1, bytes);
    double rate = 0.0;
    int ack = 0;
    for (int r = -1; r < reps; r++) {   /* r = -1 warms up */
        MPI_Request req;
        double t0 = dm_now();
        if (rank == 0) {
            WORLD_MPI(MPI_Isend(buf, (int)bytes, MPI_BYTE, 1, 77, MPI_COMM_WORLD, &req));
            world_wait(&req);
            WORLD_MPI(MPI_Irecv(&ack, 1, MPI_INT, 1, 78, MPI_COMM_WORLD, &req));
            world_wait(&req);
        } else {
            WORLD_MPI(MPI_Irecv(buf, (int)bytes, MPI_BYTE, 0, 77, MPI_COMM_WORLD, &req));
            world_wait(&req);
            WORLD_MPI(MPI_Isend(&ack, 1, MPI_INT, 0, 78, MPI_COMM_WORLD, &req));
            world_wait(&req);
        }
        if (r >= 0) rate += (dm_now() - t0);
    }
    dm_free(buf);
    return (double)bytes * reps / rate;
}

/* One round of waiting. A rank with a CPU of its own yields and polls
 * again at once. An oversubscribed rank that has waited WAIT_SPIN_S sleeps
 * WAIT_SLEEP_NS between polls instead: a yielding rank stays runnable, so
 * the kernel counts it as load, keeps it on a CPU a computing stage could
 * use, and (with short sleeps) wakes it often enough to preempt the stage
 * computing there. Measured in docs/PERFORMANCE.md (4 ranks on 2 cores:
 * 50 us sleeps or yielding made steps 40-70% slower than 500 us sleeps
 * with SCHED_BATCH). A sleep adds at most its length to the wait it ends. */
#define WAIT_SPIN_S 100e-6
#define WAIT_SLEEP_NS 500000L

void world_wait_round(double t0)
{
    world_release_turn();   /* a waiting rank computes nothing */
    if (oversubscribed && dm_now() - t0 > WAIT_SPIN_S) {
        struct timespec pause = {0, WAIT_SLEEP_NS};
        nanosleep(&pause, NULL);
    } else {
        sched_yield();
    }
}

void world_poll_round(int first)
{
    static double t0;
    if (first) t0 = dm_now();
    int flag = 0;
    WORLD_MPI(MPI_Iprobe(MPI_ANY_SOURCE, MPI_ANY_TAG, MPI_COMM_WORLD, &flag, MPI_STATUS_IGNORE));
    world_wait_round(t0);
}

void world_mpi_failed(int code, const char *call, const char *file, int line)
{
    char text[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(code, text, &len) != MPI_SUCCESS)
        snprintf(text, sizeof text, "MPI error code %d", code);
    /* MPICH's text is an error stack over several lines: one line here, so
     * that a failure is one message. */
    for (char *c = text; *c; c++)
        if (*c == '\n') *c = c[1] ? ' ' : 0;
    dm_internal_error(file, line, "%s: %s", call, text);
}

static void test_or_die(MPI_Request *req, int *done)
{
    WORLD_MPI(MPI_Test(req, done, MPI_STATUS_IGNORE));
}

double world_wait(MPI_Request *req)
{
    double t0 = dm_now();
    int done = 0;
    while (*req != MPI_REQUEST_NULL) {
        test_or_die(req, &done);
        if (done) break;
        world_wait_round(t0);
    }
    return dm_now() - t0;
}

double world_wait_all(int n, MPI_Request *reqs)
{
    double t0 = dm_now();
    for (;;) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (reqs[i] == MPI_REQUEST_NULL) continue;
            int done = 0;
            test_or_die(&reqs[i], &done);
            pending += !done;
        }
        if (!pending) break;
        world_wait_round(t0);
    }
    return dm_now() - t0;
}
