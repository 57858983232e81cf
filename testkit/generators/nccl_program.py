"""What each rank of the simulated job calls, in program order: one training step at a time.

A step is Megatron's non-interleaved 1F1B schedule on top of a data-parallel wrapper::

    dp   all_gather_into_tensor_coalesced   (distributed-optimizer parameter gather, 2 buckets)
    tp   all_gather (uneven sizes)          (torch records _broadcast_oop members + ALLGATHER_coalesced)
    1F1B over the microbatches:
         forward  = recv_forward, tp _all_gather_base, tp _reduce_scatter_base
                    (+ 2 tp all_reduce on the last stage: vocab-parallel cross entropy), send_forward
         backward = recv_backward, tp _all_gather_base, tp _reduce_scatter_base, send_backward
    embedding all_reduce                    (first and last stage)
    dp   all_reduce                         (gradients)
    CPU sync                                (loss.item(), grad norm)

Every pipeline exchange is followed by a CPU sync (Megatron's ``batch_p2p_sync`` calls
``torch.cuda.synchronize()`` after ``batch_isend_irecv``; the plain-p2p steps are modelled the
same way), so a rank whose send never completes cannot enqueue its next collective. Tensor- and
data-parallel collectives are asynchronous: a rank keeps enqueuing them until the next sync.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from enum import StrEnum

from testkit.generators.nccl_topology import GroupKind, Topology

__all__ = [
    "P2PMode",
    "Phase",
    "Mutation",
    "mutate",
    "CollectiveCall",
    "P2POp",
    "P2PCall",
    "Compute",
    "CpuSync",
    "Hang",
    "ProgramItem",
    "StepPlan",
    "build_step",
    "uneven_lengths",
]

BF16 = "BFloat16"
FP32 = "Float"
_ACTIVATION = (1024, 1, 4096)  # sequence-parallel shard: (seq / tp, micro batch, hidden)
_FULL_ACTIVATION = (4096, 1, 4096)


class P2PMode(StrEnum):
    """How a step's pipeline exchanges are issued."""

    BATCHED = "batched"
    """``batch_isend_irecv``: member entries without events plus one ``nccl:coalesced``."""
    PLAIN = "plain"
    """Separate ``isend``/``irecv``: one ``nccl:send``/``nccl:recv`` entry each, with events."""


class Mutation(StrEnum):
    """How one rank's collective differs from what its peers call at the same sequence id."""

    SIZES = "sizes"
    """Its tensors are a little smaller (a wrongly sized bucket): NCCL waits for bytes forever."""
    DTYPE = "dtype"
    """Its tensors have another dtype (Float instead of BFloat16, or the reverse)."""


class Phase(StrEnum):
    """Which thread issues the call; FR records its pthread name as ``thread_name``."""

    MAIN = "python"
    """The training loop. Its pthread name is the executable's (measured: ``python``)."""
    AUTOGRAD = "pt_autograd_0"
    """The autograd engine's device thread: collectives issued from backward hooks."""


@dataclass(frozen=True, slots=True)
class CollectiveCall:
    """One collective as torch records it. ``members`` are slow-path coalesced member ops."""

    group: str
    op: str
    input_sizes: tuple[tuple[int, ...], ...]
    input_dtypes: tuple[str, ...]
    output_sizes: tuple[tuple[int, ...], ...]
    output_dtypes: tuple[str, ...]
    duration_us: int
    site: str
    phase: Phase = Phase.MAIN
    # startCoalescing/endCoalescing: each member is recorded without events, then ``op`` closes
    # the group with empty sizes. Fast-path coalesced ops (``*_coalesced`` via the coalescing
    # manager without a device) have no members.
    members: tuple["CollectiveCall", ...] = ()
    step: int = -1
    tag: str = ""

    def signature(self) -> tuple[object, ...]:
        members = tuple(m.signature() for m in self.members)
        return (self.op, self.input_sizes, self.input_dtypes, self.output_sizes,
                self.output_dtypes, members)


@dataclass(frozen=True, slots=True)
class P2POp:
    """One send or recv between global ranks ``src`` and ``dst`` in a pp group."""

    is_send: bool
    src: int
    dst: int
    size: tuple[int, ...] = _ACTIVATION
    dtype: str = BF16


@dataclass(frozen=True, slots=True)
class P2PCall:
    """One pipeline exchange (Megatron ``_communicate``) on one rank."""

    group: str
    ops: tuple[P2POp, ...]
    mode: P2PMode
    duration_us: int
    site: str
    phase: Phase = Phase.MAIN
    step: int = -1
    tag: str = ""


@dataclass(frozen=True, slots=True)
class Compute:
    """GPU compute between communications; it occupies the rank's stream."""

    duration_us: int
    launch_us: int = 400


@dataclass(frozen=True, slots=True)
class CpuSync:
    """The CPU waits until everything this rank enqueued has completed."""

    reason: str
    step: int = -1


@dataclass(frozen=True, slots=True)
class Hang:
    """The CPU stops here for good (a hung data loader, a dead process...)."""

    reason: str


ProgramItem = CollectiveCall | P2PCall | Compute | CpuSync | Hang


@dataclass(frozen=True, slots=True)
class StepPlan:
    """Knobs of one simulated training step."""

    step: int
    p2p_mode: P2PMode
    microbatches: int = 4
    fwd_us: int = 18_000
    bwd_us: int = 36_000
    # Per-rank mismatches: (rank, tag) -> how that rank's call differs from its peers'.
    mutations: dict[tuple[int, str], "Mutation"] = field(default_factory=dict)


def build_step(topology: Topology, rank: int, plan: StepPlan) -> list[ProgramItem]:
    """Rank ``rank``'s program for one step, every comm call tagged for fault injection.

    Tags read like ``fwd2.tp0`` (microbatch 2's first tp collective of the forward) or
    ``comm3.recv_forward`` (the rank's fourth pipeline exchange in the step).
    """
    builder = _StepBuilder(topology, rank, plan)
    builder.build()
    return builder.items


class _StepBuilder:
    def __init__(self, topology: Topology, rank: int, plan: StepPlan) -> None:
        self.topology = topology
        self.rank = rank
        self.plan = plan
        layout = topology.layout
        self.stage, _, _ = layout.coords(rank)
        self.last_stage = layout.pp - 1
        self.tp = _name(topology, rank, GroupKind.TP)
        self.dp = _name(topology, rank, GroupKind.DP)
        self.pp = _name(topology, rank, GroupKind.PP) if layout.pp > 1 else None
        self.embedding = topology.group_of(rank, GroupKind.EMBEDDING)
        self.pp_ranks = topology.groups[self.pp].ranks if self.pp else (rank,)
        self.items: list[ProgramItem] = []
        self.comm_count = 0

    def add(self, call: CollectiveCall) -> None:
        mutation = self.plan.mutations.get((self.rank, call.tag))
        self.items.append(mutate(call, mutation) if mutation else call)

    def build(self) -> None:
        self.add(_dp_param_gather(self.dp, self.topology.layout.dp, self.plan.step))
        self.add(_uneven_all_gather(self.tp, self.topology.layout.tp, self.plan.step))
        self.items.append(Compute(4_000))
        self._one_f_one_b()
        if self.embedding is not None:
            self.add(_collective(self.embedding.name, "nccl:all_reduce", ((12576, 4096),), FP32,
                                 8_000, "embedding_grad", self.plan.step, "embedding"))
        self.add(_collective(self.dp, "nccl:all_reduce", ((83886080,),), FP32, 60_000,
                             "grad_all_reduce", self.plan.step, "dp.grad"))
        self.items.append(CpuSync("loss.item()", self.plan.step))
        self.items.append(Compute(12_000, launch_us=2_000))

    def _one_f_one_b(self) -> None:
        """Megatron's forward_backward_pipelining_without_interleaving."""
        pp, m, stage = self.topology.layout.pp, self.plan.microbatches, self.stage
        warmup = min(pp - stage - 1, m)
        remaining = m - warmup
        fwd_mb = bwd_mb = 0
        for _ in range(warmup):
            self._communicate("recv_forward", recv_prev=True)
            self._forward(fwd_mb)
            fwd_mb += 1
            self._communicate("send_forward", send_next=True)
        if remaining:
            self._communicate("recv_forward", recv_prev=True)
        for i in range(remaining):
            self._forward(fwd_mb)
            fwd_mb += 1
            self._communicate("send_forward_recv_backward", send_next=True, recv_next=True)
            self._backward(bwd_mb)
            bwd_mb += 1
            if i == remaining - 1:
                self._communicate("send_backward", send_prev=True)
            else:
                self._communicate("send_backward_recv_forward", send_prev=True, recv_prev=True)
        for _ in range(warmup):
            self._communicate("recv_backward", recv_next=True)
            self._backward(bwd_mb)
            bwd_mb += 1
            self._communicate("send_backward", send_prev=True)

    def _forward(self, mb: int) -> None:
        step = self.plan.step
        self.items.append(Compute(self.plan.fwd_us // 2))
        self.add(_collective(self.tp, "nccl:_all_gather_base", (_ACTIVATION,), BF16, 700,
                             "sp_gather_fwd", step, f"fwd{mb}.tp0", output=(_FULL_ACTIVATION,)))
        self.items.append(Compute(self.plan.fwd_us // 2))
        self.add(_collective(self.tp, "nccl:_reduce_scatter_base", (_FULL_ACTIVATION,), BF16, 700,
                             "sp_scatter_fwd", step, f"fwd{mb}.tp1", output=(_ACTIVATION,)))
        if self.stage == self.last_stage:
            for index in range(2):  # vocab-parallel cross entropy: max, then sum of exp
                self.add(_collective(self.tp, "nccl:all_reduce", ((4096, 1),), FP32, 90,
                                     "vocab_parallel_ce", step, f"fwd{mb}.ce{index}"))

    def _backward(self, mb: int) -> None:
        step = self.plan.step
        self.items.append(Compute(self.plan.bwd_us // 2))
        self.add(_collective(self.tp, "nccl:_all_gather_base", (_ACTIVATION,), BF16, 700,
                             "sp_gather_bwd", step, f"bwd{mb}.tp0", output=(_FULL_ACTIVATION,),
                             phase=Phase.AUTOGRAD))
        self.items.append(Compute(self.plan.bwd_us // 2))
        self.add(_collective(self.tp, "nccl:_reduce_scatter_base", (_FULL_ACTIVATION,), BF16, 700,
                             "sp_scatter_bwd", step, f"bwd{mb}.tp1", output=(_ACTIVATION,),
                             phase=Phase.AUTOGRAD))

    def _communicate(self, what: str, *, send_prev: bool = False, recv_prev: bool = False,
                     send_next: bool = False, recv_next: bool = False) -> None:
        """Megatron ``_communicate``: first/last stages drop the ops they have no peer for."""
        if self.pp is None:
            return
        stage, ranks = self.stage, self.pp_ranks
        prev = ranks[stage - 1] if stage > 0 else None
        nxt = ranks[stage + 1] if stage < self.last_stage else None
        me = self.rank
        wanted = {
            "send_prev": P2POp(True, me, prev) if send_prev and prev is not None else None,
            "recv_prev": P2POp(False, prev, me) if recv_prev and prev is not None else None,
            "send_next": P2POp(True, me, nxt) if send_next and nxt is not None else None,
            "recv_next": P2POp(False, nxt, me) if recv_next and nxt is not None else None,
        }
        if self.plan.p2p_mode is P2PMode.BATCHED:
            # _batched_p2p_ops: send_prev, recv_prev, send_next, recv_next
            order = ("send_prev", "recv_prev", "send_next", "recv_next")
        elif stage % 2 == 0:
            # _p2p_ops on even stages: send_next, recv_prev, send_prev, recv_next
            order = ("send_next", "recv_prev", "send_prev", "recv_next")
        else:
            # odd stages receive first, so that neighbours never both send first
            order = ("recv_prev", "send_next", "recv_next", "send_prev")
        ops = tuple(op for key in order if (op := wanted[key]) is not None)
        if not ops:
            return
        tag = f"comm{self.comm_count}.{what}"
        self.comm_count += 1
        # The schedule issues pipeline exchanges from the main thread, backward ones included.
        self.items.append(P2PCall(self.pp, ops, self.plan.p2p_mode, 450, what, Phase.MAIN,
                                  self.plan.step, tag))
        self.items.append(CpuSync(f"{what}: torch.cuda.synchronize()", self.plan.step))


def _name(topology: Topology, rank: int, kind: GroupKind) -> str:
    info = topology.group_of(rank, kind)
    if info is None:
        raise ValueError(f"rank {rank} has no {kind} group; check the Layout")
    return info.name


def _collective(group: str, op: str, sizes: tuple[tuple[int, ...], ...], dtype: str,
                duration_us: int, site: str, step: int, tag: str, *,
                output: tuple[tuple[int, ...], ...] | None = None,
                phase: Phase = Phase.MAIN) -> CollectiveCall:
    out = output if output is not None else sizes
    return CollectiveCall(group, op, sizes, tuple(dtype for _ in sizes), out,
                          tuple(dtype for _ in out), duration_us, site, phase, step=step, tag=tag)


def _dp_param_gather(group: str, dp: int, step: int) -> CollectiveCall:
    """Megatron distributed optimizer: ``_coalescing_manager`` fast path, one entry, 2 buckets."""
    shards = ((13107200,), (7864320,))
    full = tuple((n * dp,) for (n,) in shards)
    return CollectiveCall(group, "nccl:all_gather_into_tensor_coalesced", shards, (BF16, BF16),
                          full, (BF16, BF16), 25_000, "param_gather", step=step, tag="dp.params")


def uneven_lengths(tp: int) -> tuple[int, ...]:
    """Per-tp-rank token counts gathered each step (uneven, as in MoE routing statistics)."""
    return tuple(96 + 32 * i for i in range(tp))


def _uneven_all_gather(group: str, tp: int, step: int) -> CollectiveCall:
    """``dist.all_gather`` with uneven outputs: torch runs one ``_broadcast_oop`` per root inside
    startCoalescing/endCoalescing(ALLGATHER) and records each of them plus the closing entry."""
    members = tuple(
        CollectiveCall(group, "nccl:_broadcast_oop", ((n, 2),), (FP32,), ((n, 2),), (FP32,), 0,
                       "routing_stats", step=step)
        for n in uneven_lengths(tp)
    )
    return CollectiveCall(group, "nccl:ALLGATHER_coalesced", (), (), (), (), 300, "routing_stats",
                          members=members, step=step, tag="tp.routing")


def mutate(call: CollectiveCall, how: Mutation) -> CollectiveCall:
    """``call`` as the faulty rank issues it: the same op and tag, different tensors."""
    if how is Mutation.SIZES:
        def shrink(sizes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], ...]:
            return tuple((size[0] // 2, *size[1:]) for size in sizes)
        return replace(call, input_sizes=shrink(call.input_sizes), output_sizes=shrink(call.output_sizes))
    def flip(dtypes: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(FP32 if d == BF16 else BF16 for d in dtypes)
    return replace(call, input_dtypes=flip(call.input_dtypes), output_dtypes=flip(call.output_dtypes))
