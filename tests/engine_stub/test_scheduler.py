"""Scheduler properties under random arrivals and lengths (hypothesis): no deadlock, every request
finishes with exactly its tokens, the token budget and max_num_seqs hold, preemption takes the
newest running request, `reserve` never preempts, `prefill-first` never mixes prompts and decodes;
the same under `--tenant-policy fair`."""
from hypothesis import given, settings, strategies as st

from llm_replay.engine_stub.block_manager import BlockManager
from llm_replay.engine_stub.config import POLICIES, EngineConfig
from llm_replay.engine_stub.request import EngineRequest, SamplingParams, Status
from llm_replay.engine_stub.scheduler import Scheduler

BS = 4

workload = st.lists(st.tuples(st.integers(0, 30), st.integers(1, 40), st.integers(1, 20)), min_size=1, max_size=25)


def simulate(policy, reqs_spec, num_blocks, budget, max_seqs, tenant_policy="fcfs"):
    cfg = EngineConfig(block_size=BS, num_blocks=num_blocks, max_num_seqs=max_seqs,
                       max_num_batched_tokens=budget, max_model_len=num_blocks * BS, policy=policy,
                       tenant_policy=tenant_policy)
    bm = BlockManager(num_blocks, BS)
    sched = Scheduler(cfg, bm)
    pending = sorted(enumerate(reqs_spec), key=lambda x: x[1][0])
    reqs, step, preemptions = [], 0, 0
    limit = 50 + 10 * sum(p + m for _, p, m in reqs_spec)
    while pending or sched.has_work():
        step += 1
        assert step < limit, "deadlock: the scheduler stopped making progress"
        while pending and pending[0][1][0] <= step:
            i, (_, plen, max_tokens) = pending.pop(0)
            plen = min(plen, cfg.max_model_len - max_tokens) if plen + max_tokens > cfg.max_model_len else plen
            r = EngineRequest(str(i), [1000 + (i % 3)] * max(plen, 1), SamplingParams(max_tokens=max_tokens), step,
                              seq=i + 1, tenant="ab"[i % 2])
            reqs.append(r)
            sched.add(r)
        was_waiting = {id(r) for r in sched.waiting}
        out = sched.schedule()
        if policy != "prefill-first":
            assert out.num_tokens <= budget
        assert len(sched.running) <= max_seqs
        assert len({id(r) for r, _ in out.items}) == len(out.items)
        for v in out.preempted:  # the victims were the newest running requests
            assert all(v.seq > r.seq for r in sched.running)
            assert v.block_ids == [] and v.status is Status.WAITING
        preemptions += len(out.preempted)
        if policy == "prefill-first" and out.items:
            kinds = {id(r) in was_waiting for r, _ in out.items}
            assert len(kinds) == 1, "prefill-first mixed prompts and decodes in one step"
        for r, n in out.items:  # what the model would do: compute, then sample at the end
            assert n >= 1 and len(r.block_ids) * BS >= r.num_computed_tokens + n
            r.num_computed_tokens += n
            bm.cache_full_blocks(r)
            if r.num_computed_tokens == r.num_tokens:
                r.token_ids.append(5000 + r.num_output_tokens)
                if r.num_output_tokens >= r.params.max_tokens or r.num_tokens >= cfg.max_model_len:
                    sched.finish(r, "length")
    assert all(r.status is Status.FINISHED for r in reqs)
    assert bm.usage == 0.0
    for r in reqs:
        assert r.token_ids[len(r.prompt_token_ids):] == [5000 + k for k in range(r.num_output_tokens)]
        assert r.num_output_tokens == min(r.params.max_tokens, cfg.max_model_len - r.num_prompt_tokens)
    return preemptions


@settings(max_examples=60, deadline=None)
@given(workload, st.integers(12, 40), st.integers(4, 64), st.integers(1, 8))
def test_chunked_policy(spec, num_blocks, budget, max_seqs):
    simulate("chunked", spec, num_blocks, budget, max_seqs)


@settings(max_examples=40, deadline=None)
@given(workload, st.integers(12, 40), st.integers(4, 64), st.integers(1, 8))
def test_reserve_policy_never_preempts(spec, num_blocks, budget, max_seqs):
    assert simulate("reserve", spec, num_blocks, budget, max_seqs) == 0


@settings(max_examples=40, deadline=None)
@given(workload, st.integers(12, 40), st.integers(4, 64), st.integers(1, 8))
def test_prefill_first_policy(spec, num_blocks, budget, max_seqs):
    simulate("prefill-first", spec, num_blocks, budget, max_seqs)


def test_small_pool_preempts():
    # eight long requests in a 12-block pool must preempt, and still all finish
    assert simulate("chunked", [(0, 10, 20)] * 8, 12, 64, 8) > 0


@settings(max_examples=40, deadline=None)
@given(workload, st.integers(12, 40), st.integers(4, 64), st.integers(1, 8), st.sampled_from(POLICIES))
def test_fair_tenant_policy(spec, num_blocks, budget, max_seqs, policy):
    preemptions = simulate(policy, spec, num_blocks, budget, max_seqs, tenant_policy="fair")
    assert policy != "reserve" or preemptions == 0
