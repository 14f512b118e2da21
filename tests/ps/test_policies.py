"""The synchronisation policies on scripted arrival orders (pure Python, no Ray)."""

from __future__ import annotations

import pytest

from trainscale.ps.policies import Apply, Cancel, Launch, Policy, resolve_k

pytestmark = pytest.mark.timeout(30)


def tickets_of(actions, learner=None):
    """{learner: ticket} of the Launch actions."""
    return {a.learner: a.ticket for a in actions if isinstance(a, Launch) and (learner is None or a.learner == learner)}


def applies(actions):
    return [a for a in actions if isinstance(a, Apply)]


def test_sync_waits_for_all_and_relaunches_everyone():
    p = Policy("sync", learners=3)
    t = tickets_of(p.start())
    assert p.arrive(t[2]) == [] and p.arrive(t[0]) == []
    acts = p.arrive(t[1])
    (ap,) = applies(acts)
    assert ap.version == 1 and [g.learner for g in ap.grads] == [2, 0, 1] and ap.staleness == (0, 0, 0)
    assert not [a for a in acts if isinstance(a, Cancel)]
    assert sorted(a.learner for a in acts if isinstance(a, Launch)) == [0, 1, 2]
    assert all(a.version == 1 for a in acts if isinstance(a, Launch))


def test_k_sync_takes_first_k_cancels_the_rest_and_restarts_all():
    p = Policy("k-sync", learners=4, k=2)
    t = tickets_of(p.start())
    assert p.arrive(t[3]) == []
    acts = p.arrive(t[1])
    (ap,) = applies(acts)
    assert [g.learner for g in ap.grads] == [3, 1] and ap.staleness == (0, 0)
    cancels = [a for a in acts if isinstance(a, Cancel)]
    assert sorted((c.learner, c.ticket) for c in cancels) == [(0, t[0]), (2, t[2])]
    launches = [a for a in acts if isinstance(a, Launch)]
    assert sorted(a.learner for a in launches) == [0, 1, 2, 3] and {a.version for a in launches} == {1}
    # Work that was cancelled and still reports in is ignored: never taken as a gradient.
    assert p.arrive(t[0]) == [] and p.buffer == []


def test_k_batch_sync_counts_batches_from_any_learner_on_the_same_parameters():
    p = Policy("k-batch-sync", learners=3, k=3)
    t = tickets_of(p.start())
    a1 = p.arrive(t[0])  # learner 0 pushes and starts its next batch on version 0 at once
    (l0,) = [a for a in a1 if isinstance(a, Launch)]
    assert l0.learner == 0 and l0.version == 0
    a2 = p.arrive(l0.ticket)  # learner 0 again: two of the three batches come from it
    (l0b,) = [a for a in a2 if isinstance(a, Launch)]
    acts = p.arrive(t[2])
    (ap,) = applies(acts)
    assert [g.learner for g in ap.grads] == [0, 0, 2] and ap.staleness == (0, 0, 0)
    cancels = sorted((c.learner, c.ticket) for c in acts if isinstance(c, Cancel))
    assert cancels == [(0, l0b.ticket), (1, t[1])]  # unfinished work is cancelled at the update
    assert sorted(a.learner for a in acts if isinstance(a, Launch)) == [0, 1, 2]


def test_async_applies_every_gradient_with_its_staleness():
    p = Policy("async", learners=3)
    assert p.k == 1
    t = tickets_of(p.start())
    acts = p.arrive(t[1])
    (ap,) = applies(acts)
    assert ap.version == 1 and ap.staleness == (0,)
    (relaunch,) = [a for a in acts if isinstance(a, Launch)]
    assert relaunch.learner == 1 and relaunch.version == 1
    assert not [a for a in acts if isinstance(a, Cancel)]
    (ap2,) = applies(p.arrive(t[0]))  # computed on version 0, applied when the server is at 1
    assert ap2.staleness == (1,) and ap2.version == 2
    (ap3,) = applies(p.arrive(t[2]))
    assert ap3.staleness == (2,)
    (ap4,) = applies(p.arrive(relaunch.ticket))  # learner 1 started on version 1; server is at 3
    assert ap4.staleness == (2,)


def test_k_async_waits_for_k_learners_and_cancels_nothing():
    p = Policy("k-async", learners=4, k=2)
    t = tickets_of(p.start())
    p.arrive(t[0])
    acts = p.arrive(t[1])
    (ap,) = applies(acts)
    assert ap.staleness == (0, 0) and not [a for a in acts if isinstance(a, Cancel)]
    launches = tickets_of(acts)
    assert sorted(launches) == [0, 1]  # only the two that pushed restart; 2 and 3 keep computing
    assert p.arrive(t[2]) == []
    (ap2,) = applies(p.arrive(launches[0]))
    assert [g.learner for g in ap2.grads] == [2, 0] and ap2.staleness == (1, 0)


def test_k_batch_async_restarts_on_current_parameters_and_cancels_nothing():
    p = Policy("k-batch-async", learners=3, k=2)
    t = tickets_of(p.start())
    (l0,) = [a for a in p.arrive(t[0]) if isinstance(a, Launch)]
    assert l0.version == 0
    acts = p.arrive(t[1])
    (ap,) = applies(acts)
    assert ap.staleness == (0, 0) and not [a for a in acts if isinstance(a, Cancel)]
    (l1,) = [a for a in acts if isinstance(a, Launch)]
    assert l1.learner == 1 and l1.version == 1  # the pusher fetches the new parameters
    p.arrive(t[2])  # learner 2 computed on version 0, still running through the update
    (ap2,) = applies(p.arrive(l0.ticket))
    assert [g.learner for g in ap2.grads] == [2, 0] and ap2.staleness == (1, 1)


def test_lost_learner_work_is_dropped_and_it_rejoins_on_current_parameters():
    p = Policy("sync", learners=3)
    t = tickets_of(p.start())
    p.arrive(t[0])
    assert p.lost(1) == []
    assert p.arrive(t[1]) == []  # its gradient never counts, even if it shows up
    p.arrive(t[2])
    (back,) = p.rejoin(1)
    assert back.learner == 1 and back.version == 0
    (ap,) = applies(p.arrive(back.ticket))
    assert sorted(g.learner for g in ap.grads) == [0, 1, 2]


def test_rejoin_does_not_relaunch_a_learner_whose_gradient_waits():
    p = Policy("k-async", learners=3, k=2)
    t = tickets_of(p.start())
    p.arrive(t[0])
    p.lost(0)
    assert p.rejoin(0) == []  # its gradient is in; it restarts at the update
    acts = p.arrive(t[1])
    assert sorted(tickets_of(acts)) == [0, 1]


def test_remove_shrinks_sync_and_fails_k_sync_when_too_few_are_left():
    p = Policy("sync", learners=3)
    t = tickets_of(p.start())
    p.arrive(t[0])
    p.arrive(t[1])
    (ap,) = applies(p.remove(2))
    assert len(ap.grads) == 2
    q = Policy("k-sync", learners=2, k=2)
    q.start()
    with pytest.raises(RuntimeError, match="needs K = 2"):
        q.remove(1)


def test_resolve_k_and_bad_k():
    assert resolve_k("sync", 5, "auto") == 5 and resolve_k("async", 5, 3) == 1
    assert resolve_k("k-sync", 8, "auto") == 4 and resolve_k("k-async", 8, 3) == 3
    with pytest.raises(ValueError):
        Policy("k-sync", learners=2, k=3)
    with pytest.raises(ValueError):
        Policy("downpour", learners=2)


@pytest.mark.parametrize("mode", ["sync", "k-sync", "k-batch-sync", "async", "k-async", "k-batch-async"])
def test_random_arrivals_keep_invariants(mode):
    """Random arrival orders: every applied gradient was launched once, staleness = version gap."""
    import random

    rng = random.Random(0)
    p = Policy(mode, learners=4, k=2)
    launched = {a.ticket: a for a in p.start()}
    applied = set()
    for _ in range(300):
        ticket = rng.choice(sorted(p.busy))
        for a in p.arrive(ticket):
            if isinstance(a, Launch):
                launched[a.ticket] = a
            elif isinstance(a, Apply):
                assert len(a.grads) == p.k
                for g, s in zip(a.grads, a.staleness):
                    assert g.ticket not in applied and launched[g.ticket].version == g.version
                    assert s == a.version - 1 - g.version >= 0
                    applied.add(g.ticket)
                if mode in ("sync", "k-sync", "k-batch-sync"):
                    assert set(a.staleness) == {0}
        assert len({w.learner for w in p.busy.values()}) == len(p.busy)  # one mini-batch per learner at a time
    assert p.version > 10
