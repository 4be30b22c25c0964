#!/usr/bin/env python3
"""Named-barrier model of the ws attention kernel's tile loop (kernels/ds4/sparse_attention.cu).

Why: a deadlock once took 700 s of device time to find (the PV warpgroup waiting at a 384-thread
FULL bar.sync for the math warpgroup, which waited for it at P_READY) that this model finds in
milliseconds. Before a device run of a change to the handoffs, write its barrier sequence here and
run `python3 tools/kernel/ws_protocol_model.py`: it explores every interleaving of the three roles for
1..MAX_TILES tiles and reports a deadlock, or an arrival that lands in a barrier phase it does not
belong to (a role arriving twice in one phase, or mixed thread counts), or an arrival that no one
waits for (a phase still open when every role is done).

The model is hand-written from the kernel: each role is its sequence of bar.sync / bar.arrive
(counts in warpgroups of 128 threads; 384 threads = 3). It checks the protocol, not the code: keep
it in step with the kernel when the handoffs change. Memory ordering and the cluster merge are not
modelled.
"""
import sys

MAX_TILES = 7


def head(n, s_done=False):
    """The shipped loop: whole-stage FULL / EMPTY of 384 threads, lockstep consumers. "X" is the
    kernel's P_FREE: the PV warpgroup's PV of tile j - 1 is done.

    s_done=True is the -DGRAPHSAFE_DS4_FILL_AFTER_S experiment (measured on the H200: correct,
    racecheck clean, 0.9 us slower): S_DONE (256 threads), which the math warpgroup arrives at once the scores of tile j
    are complete (j < n - 1) and the producer waits for (after EMPTY) before it fills tile j + 1,
    so that its 64 KB of shared stores land during the softmax and PV instead of during S."""
    prod, math, pv = [], [], []
    for j in range(n):
        st = j & 1
        if j >= 2:
            prod.append(("sync", f"EMPTY{st}", 3))
        if s_done and j >= 1:
            prod.append(("sync", "SDONE", 2))
        prod.append(("arrive", f"FULL{st}", 3))
    for role in (math, pv):
        if n > 0:
            role.append(("sync", "Q", 2))
        for j in range(n):
            st = j & 1
            role += [("sync", f"FULL{st}", 3), ("sync", "X", 2)]
            if s_done and role is math and j + 1 < n:
                role.append(("arrive", "SDONE", 2))
            role.append(("sync", "P", 2))
            if j + 2 < n:
                role.append(("arrive", f"EMPTY{st}", 3))
        role.append(("sync", "Q", 2))
    return {"producer": prod, "math": math, "pv": pv}


def s_ahead(n):
    """The S-ahead experiment (-DGRAPHSAFE_DS4_S_AHEAD=1; measured on the
    H200: correct, racecheck clean, C4 26.36 us vs 24.91 without): the math warpgroup waits FULL
    of tile j + 1 and issues its S right after issuing its PV of tile j, and arrives at EMPTY of
    tile j once that PV has retired, in iteration j + 1 (before the P_FREE sync)."""
    progs = head(n)
    math = []
    if n > 0:
        math += [("sync", "Q", 2), ("sync", "FULL0", 3)]
    for j in range(n):
        st = j & 1
        if j > 0 and j + 1 < n:
            math.append(("arrive", f"EMPTY{st ^ 1}", 3))
        math += [("sync", "X", 2), ("sync", "P", 2)]
        if j + 1 < n:
            math.append(("sync", f"FULL{st ^ 1}", 3))
    math.append(("sync", "Q", 2))
    progs["math"] = math
    return progs


def alternate(n, full_per_warpgroup=True, ready_sync=False):
    """The alternation experiment, -DGRAPHSAFE_DS4_ALTERNATE=1 (measured on the H200: correct, memcheck and racecheck clean, C4 26.22 us vs 25.25 for the
    shipped loop in the same run): the consumer warpgroups take turns. Warpgroup c
    owns tiles t with t % 2 == c; its loop walks the other's tiles j = c - 1, c + 1, ...: FULL(j)
    (j >= 0), FULL(j + 1) and S(j + 1) (if j + 1 < n), READY(j) sync (j >= 0), softmax(j + 1) and
    READY(j + 1) arrive, PV(j) then EMPTY(j), PV(j + 1) then EMPTY(j + 1). The producer arrives at
    a FULL per consumer warpgroup (one 384-thread FULL is also deadlock-free, but it would make a
    warpgroup's S(j + 1) wait until the other reaches FULL(j + 1), after its PV(j): no overlap).
    ready_sync=True (the owner syncs READY instead of arriving, as the other handoffs do for
    racecheck) must deadlock: the owner of j + 1 waits at READY(j + 1) for the other warpgroup,
    which waits at FULL(j + 2) for the stage that the owner's PV(j) has not released."""
    prod = []
    for j in range(n):
        st = j & 1
        if j >= 2:
            prod.append(("sync", f"EMPTY{st}", 3))
        if full_per_warpgroup:
            prod += [("arrive", f"FULLa{st}", 2), ("arrive", f"FULLb{st}", 2)]
        else:
            prod.append(("arrive", f"FULL{st}", 3))
    progs = {"producer": prod}
    for c, name in ((0, "wg0"), (1, "wg1")):
        full = (lambda t, c=c: ("sync", f"FULL{'ab'[c]}{t & 1}", 2)) if full_per_warpgroup else (lambda t: ("sync", f"FULL{t & 1}", 3))
        ops = [("sync", "Q", 2)] if n > 0 else []
        for j in range(c - 1, n, 2):
            t = j + 1
            if j >= 0:
                ops.append(full(j))
            if t < n:
                ops.append(full(t))
            if j >= 0:
                ops.append(("sync", f"READY{j & 1}", 2))
            if t < n:
                ops.append(("sync" if ready_sync else "arrive", f"READY{t & 1}", 2))
            if j >= 0 and j + 2 < n:
                ops.append(("arrive", f"EMPTY{j & 1}", 3))
            if t < n and t + 2 < n:
                ops.append(("arrive", f"EMPTY{t & 1}", 3))
        progs[name] = ops
    return progs


def extra_s_done(n):
    """head(n, s_done=True) with one more S_DONE arrival by the math warpgroup at the end, which
    no one waits for: the model must report it (the check for phases left open)."""
    progs = head(n, s_done=True)
    progs["math"] = progs["math"] + [("arrive", "SDONE", 2)]
    return progs


def pv_ahead(n, full_per_warpgroup=True, half_stages=True):
    """The PV-ahead experiment: the PV warpgroup's S of tile j + 1 before its PV of tile j.
    full_per_warpgroup=False is one 384-thread FULL (deadlocks); half_stages=False refills whole
    stages, True in two halves (the experiment's default, paged producer)."""
    prod, math, pv = [], [], []
    if full_per_warpgroup:
        fm = lambda st: ("FULLm%d" % st, 2)
        fp = lambda st: ("FULLp%d" % st, 2)
    else:
        fm = fp = lambda st: ("FULL%d" % st, 3)
    for j in range(n):
        st = j & 1
        if not full_per_warpgroup:
            if j >= 2:
                prod.append(("sync", f"EMPTY{st}", 3))
            prod.append(("arrive", *fm(st)))
            continue
        if half_stages:
            if j >= 2:
                prod.append(("sync", f"EMPTYp{st}", 2))
            prod.append(("arrive", *fp(st)))
            if j >= 2:
                prod.append(("sync", f"EMPTYm{st}", 2))
            prod.append(("arrive", *fm(st)))
        else:
            if j >= 2:
                prod += [("sync", f"EMPTYp{st}", 2), ("sync", f"EMPTYm{st}", 2)]
            prod += [("arrive", *fp(st)), ("arrive", *fm(st))]
    empty = (lambda st, who: (f"EMPTY{who}{st}", 2)) if full_per_warpgroup else (lambda st, who: (f"EMPTY{st}", 3))
    if n > 0:
        math.append(("sync", "Q", 2))
        pv.append(("sync", "Q", 2))
    for j in range(n):
        st = j & 1
        math += [("sync", *fm(st)), ("sync", "X", 2), ("sync", "P", 2)]
        if j + 2 < n:
            math.append(("arrive", *empty(st, "m")))
    math.append(("sync", "Q", 2))
    if n > 0:
        pv += [("sync", *fp(0)), ("sync", "X", 2)]
    for j in range(n):
        st = j & 1
        if j + 1 < n:
            pv.append(("sync", *fp(st ^ 1)))
        pv.append(("sync", "P", 2))
        if j + 2 < n:
            pv.append(("arrive", *empty(st, "p")))
        if j + 1 < n:
            pv.append(("sync", "X", 2))
    pv.append(("sync", "Q", 2))
    return {"producer": prod, "math": math, "pv": pv}


def check(progs):
    """Every interleaving (depth-first over states, memoized). Returns None or a failure string."""
    names = sorted(progs)
    seen = set()

    def step(pcs, bars, waiting):
        key = (pcs, bars, waiting)
        if key in seen:
            return None
        seen.add(key)
        if all(pcs[i] == len(progs[r]) for i, r in enumerate(names)):
            # An arrival nobody waited for leaves a phase open at exit; the cluster merge reuses
            # named barriers after the loop, so that is a bug too.
            if bars:
                return "barrier phase left incomplete at exit: " + ", ".join(
                    f"{bar} ({got} of {need}: {', '.join(m)})" for bar, (got, need, m) in bars)
            return None
        moved = False
        for i, r in enumerate(names):
            if waiting[i] is not None or pcs[i] == len(progs[r]):
                continue
            kind, bar, count = progs[r][pcs[i]]
            b = dict(bars)
            got, need, members = b.get(bar, (0, count, ()))
            if need != count:
                return f"{r} uses {bar} with count {count}, the phase in progress has {need}"
            if r in members:
                return f"{r} arrives twice in one phase of {bar} (pc {pcs[i]})"
            got, members = got + 1, members + (r,)
            w = list(waiting)
            if kind == "sync":
                w[i] = bar
            if got == need:  # the phase completes: release its waiters, reset
                b.pop(bar, None)
                w = [None if (x == bar and names[k] in members) else x for k, x in enumerate(w)]
            else:
                b[bar] = (got, need, members)
            p = list(pcs)
            p[i] += 1
            moved = True
            err = step(tuple(p), tuple(sorted(b.items())), tuple(w))
            if err:
                return err
        if not moved:
            where = []
            for i, r in enumerate(names):
                if waiting[i] is not None:
                    where.append(f"{r} waits at {progs[r][pcs[i] - 1]} (op {pcs[i] - 1})")
                else:
                    where.append(f"{r} done")
            return "deadlock: " + ", ".join(where)
        return None

    sys.setrecursionlimit(100000)
    return step(tuple(0 for _ in names), (), tuple(None for _ in names))


def main():
    cases = [
        ("shipped", head, True),
        ("alternate: the consumer warpgroups take turns, a FULL per warpgroup", alternate, True),
        ("alternate with one 384-thread FULL", lambda n: alternate(n, False), True),
        ("alternate with READY synced by the owner too (must deadlock)", lambda n: alternate(n, True, True), False),
        ("S ahead: the math warpgroup's S of tile j + 1 before its PV of tile j retires", s_ahead, True),
        ("fill after S: the producer waits for S_DONE after EMPTY", lambda n: head(n, s_done=True), True),
        ("fill after S with one S_DONE arrival too many (must be found)", extra_s_done, False),
        ("PV ahead, one 384-thread FULL", lambda n: pv_ahead(n, False), False),
        ("PV ahead, FULL per warpgroup, whole stages", lambda n: pv_ahead(n, True, False), True),
        ("PV ahead, FULL and EMPTY per warpgroup, half stages", lambda n: pv_ahead(n), True),
    ]
    bad = 0
    for name, gen, want_ok in cases:
        errs = [(n, check(gen(n))) for n in range(0, MAX_TILES + 1)]
        errs = [(n, e) for n, e in errs if e]
        ok = not errs
        verdict = "ok" if ok else f"n={errs[0][0]}: {errs[0][1]}"
        expect = "" if ok == want_ok else "   <-- UNEXPECTED"
        bad += ok != want_ok
        print(f"{name}: {verdict}{expect}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
