"""Python stack frames for the simulated call sites, as pickle dumps carry them in ``frames``.

Innermost first, as ``getCollectiveTrace`` writes them: ``{"name", "filename", "line"}``. torch
line numbers are those of torch 2.13's ``distributed_c10d.py``; the Megatron ones are made up.
JSON dumps carry no frames.
"""

from __future__ import annotations

from functools import cache

__all__ = ["frames_for"]

_SITE_PACKAGES = "/usr/local/lib/python3.11/site-packages/torch/"
_C10D = _SITE_PACKAGES + "distributed/distributed_c10d.py"
_AUTOGRAD = _SITE_PACKAGES + "autograd/function.py"
_M = "/workspace/Megatron-LM/megatron/"
_SCHEDULES = _M + "core/pipeline_parallel/schedules.py"
_P2P = _M + "core/pipeline_parallel/p2p_communication.py"
_MAPPINGS = _M + "core/tensor_parallel/mappings.py"
_BUFFER = _M + "core/distributed/param_and_grad_buffer.py"
_DDP = _M + "core/distributed/distributed_data_parallel.py"
_FINALIZE = _M + "core/distributed/finalize_model_grads.py"
_TRAINING = _M + "training/training.py"
_DISPATCHER = _M + "core/transformer/moe/token_dispatcher.py"
_EXPERTS = _M + "core/transformer/moe/experts.py"

Frame = tuple[str, str, int]

_LOGGER: Frame = ("wrapper", _SITE_PACKAGES + "distributed/c10d_logger.py", 83)
_FORWARD_STEP: Frame = ("forward_step", _SCHEDULES, 402)
_TRAIN: tuple[Frame, ...] = (
    ("forward_backward_pipelining_without_interleaving", _SCHEDULES, 1912),
    ("train_step", _TRAINING, 1187),
    ("train", _TRAINING, 1622),
    ("pretrain", _TRAINING, 398),
    ("<module>", "/workspace/Megatron-LM/pretrain_gpt.py", 284),
)
_BLOCK: Frame = ("forward", _M + "core/transformer/transformer_block.py", 548)

_A2A = ("all_to_all_single", _C10D, 4832)
_MOE_FWD: tuple[Frame, ...] = (("forward", _M + "core/transformer/moe/moe_layer.py", 254), _BLOCK,
                               _FORWARD_STEP)
_SITES: dict[str, tuple[Frame, ...]] = {
    "barrier": (("barrier", _C10D, 5338), _LOGGER,
                ("initialize_megatron", _M + "training/initialize.py", 112), *_TRAIN[3:]),
    "param_gather": (("_coalescing_manager", _C10D, 2909), ("start_param_sync", _BUFFER, 248),
                     ("start_param_sync", _DDP, 461), *_TRAIN[1:]),
    "routing_stats": (("all_gather", _C10D, 4280), _LOGGER,
                      ("gather_tokens_per_expert", _M + "core/transformer/moe/moe_utils.py", 507),
                      _FORWARD_STEP, *_TRAIN),
    "sp_gather_fwd": (("all_gather_into_tensor", _C10D, 4460), _LOGGER,
                      ("_gather_along_first_dim", _MAPPINGS, 117), ("forward", _MAPPINGS, 254),
                      _BLOCK, _FORWARD_STEP, *_TRAIN),
    "sp_scatter_fwd": (("reduce_scatter_tensor", _C10D, 5012), _LOGGER,
                       ("_reduce_scatter_along_first_dim", _MAPPINGS, 169),
                       ("forward", _MAPPINGS, 301), _BLOCK, _FORWARD_STEP, *_TRAIN),
    "vocab_parallel_ce": (("all_reduce", _C10D, 3245), _LOGGER,
                          ("forward", _M + "core/tensor_parallel/cross_entropy.py", 142),
                          _FORWARD_STEP, *_TRAIN),
    "sp_gather_bwd": (("all_gather_into_tensor", _C10D, 4460), _LOGGER,
                      ("_gather_along_first_dim", _MAPPINGS, 117), ("backward", _MAPPINGS, 308),
                      ("apply", _AUTOGRAD, 307)),
    "sp_scatter_bwd": (("reduce_scatter_tensor", _C10D, 5012), _LOGGER,
                       ("_reduce_scatter_along_first_dim", _MAPPINGS, 169),
                       ("backward", _MAPPINGS, 262), ("apply", _AUTOGRAD, 307)),
    "embedding_grad": (("all_reduce", _C10D, 3245), _LOGGER,
                       ("_allreduce_word_embedding_grads", _FINALIZE, 141),
                       ("finalize_model_grads", _FINALIZE, 282), *_TRAIN),
    "moe_dispatch": (_A2A, _LOGGER, ("all_to_all", _MAPPINGS, 470),
                     ("token_permutation", _DISPATCHER, 612), *_MOE_FWD, *_TRAIN),
    "moe_combine": (_A2A, _LOGGER, ("all_to_all", _MAPPINGS, 470),
                    ("token_unpermutation", _DISPATCHER, 689), *_MOE_FWD, *_TRAIN),
    "moe_dispatch_bwd": (_A2A, _LOGGER, ("backward", _MAPPINGS, 488), ("apply", _AUTOGRAD, 307)),
    "moe_combine_bwd": (_A2A, _LOGGER, ("backward", _MAPPINGS, 488), ("apply", _AUTOGRAD, 307)),
    "expert_tp_gather": (("all_gather_into_tensor", _C10D, 4460), _LOGGER,
                         ("_gather_along_first_dim", _MAPPINGS, 117), ("forward", _EXPERTS, 801),
                         *_MOE_FWD, *_TRAIN),
    "expert_tp_scatter": (("reduce_scatter_tensor", _C10D, 5012), _LOGGER,
                          ("_reduce_scatter_along_first_dim", _MAPPINGS, 169),
                          ("forward", _EXPERTS, 812), *_MOE_FWD, *_TRAIN),
    "expert_tp_gather_bwd": (("all_gather_into_tensor", _C10D, 4460), _LOGGER,
                             ("_gather_along_first_dim", _MAPPINGS, 117), ("backward", _MAPPINGS, 308),
                             ("apply", _AUTOGRAD, 307)),
    "expert_tp_scatter_bwd": (("reduce_scatter_tensor", _C10D, 5012), _LOGGER,
                              ("_reduce_scatter_along_first_dim", _MAPPINGS, 169),
                              ("backward", _MAPPINGS, 262), ("apply", _AUTOGRAD, 307)),
    "grad_reduce_scatter": (("_coalescing_manager", _C10D, 2909), ("start_grad_sync", _BUFFER, 331),
                            ("finish_grad_sync", _DDP, 498), ("finalize_model_grads", _FINALIZE, 271),
                            *_TRAIN),
    "grad_all_reduce": (("all_reduce", _C10D, 3245), _LOGGER, ("start_grad_sync", _BUFFER, 331),
                        ("finish_grad_sync", _DDP, 498), ("finalize_model_grads", _FINALIZE, 271),
                        *_TRAIN),
}
_BATCHED: tuple[Frame, ...] = (("batch_isend_irecv", _C10D, 3053), ("_batched_p2p_ops", _P2P, 191))
_ISEND: tuple[Frame, ...] = (("isend", _C10D, 2652), _LOGGER, ("_p2p_ops", _P2P, 233))
_IRECV: tuple[Frame, ...] = (("irecv", _C10D, 2709), _LOGGER, ("_p2p_ops", _P2P, 241))
_P2P_SITES = ("recv_forward", "send_forward", "send_forward_recv_backward",
              "send_backward_recv_forward", "recv_backward", "send_backward")


@cache
def frames_for(site: str, batched: bool = False, recv: bool = False) -> tuple[dict[str, object], ...]:
    """The frames for ``site``; the same dict objects every time, as torch's pickler shares them."""
    if site in _P2P_SITES:
        api = _BATCHED if batched else (_IRECV if recv else _ISEND)
        line = 520 + 17 * _P2P_SITES.index(site)
        raw: tuple[Frame, ...] = (*api, ("_communicate", _P2P, 404), (site, _P2P, line), *_TRAIN)
    else:
        raw = _SITES[site]
    return tuple({"name": name, "filename": filename, "line": line} for name, filename, line in raw)
