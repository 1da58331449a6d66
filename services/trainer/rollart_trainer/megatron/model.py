"""The Qwen3 family as a Megatron-core ``GPTModel``, and the packed-rows logprob wrapper the GRPO code calls.

:func:`build_gpt_model` maps a :class:`~.convert.Qwen3Layout` onto Megatron's ``TransformerConfig`` with the
local (non Transformer-Engine) layer spec: RMSNorm, q/k RMSNorm per head before RoPE (qk-norm), grouped-query
attention (``num_query_groups`` = KV heads), RoPE with the config's theta, SwiGLU (gated linear unit with
SiLU), no biases, no dropout, embeddings tied to the output layer when the config ties them.

:class:`MegatronTokenLogprobs` has the same ``forward`` as :class:`rollart_trainer.grpo.TokenLogprobs`, so the
shared GRPO step (packing, loss, accumulation) runs unchanged on it. Rows are packed streams whose position
ids restart at 0; Megatron's RoPE only knows positions ``0..s-1`` of one sequence, so the wrapper computes
the rotary angles from the position ids itself and passes a block-diagonal causal mask: a token attends to
earlier tokens of its own stream only, as in the Hugging Face model.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from .convert import Qwen3Layout


def build_gpt_model(layout: Qwen3Layout, *, params_dtype: torch.dtype = torch.float32) -> nn.Module:
    """This rank's ``GPTModel`` for the layout (model-parallel state must be initialised; weights are not
    initialised: load them with the converter).

    With pipeline parallelism it is this rank's stage: its share of the layers, the embeddings on the first
    stage only, the final norm and output layer on the last only. Tied embeddings are shared by one parameter
    on a single stage; over several stages the last holds a plain output layer that the converter loads with
    the embeddings and the backend keeps equal to them (Megatron's own set-up of that copy moves it to CUDA).
    """
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    pp = int(parallel_state.get_pipeline_model_parallel_world_size())

    cfg = TransformerConfig(
        num_layers=layout.num_layers,
        hidden_size=layout.hidden,
        num_attention_heads=layout.heads,
        num_query_groups=layout.kv_heads,
        kv_channels=layout.head_dim,
        ffn_hidden_size=layout.intermediate,
        normalization="RMSNorm",
        layernorm_epsilon=layout.norm_eps,
        gated_linear_unit=True,
        activation_func=F.silu,
        add_bias_linear=False,
        add_qkv_bias=False,
        qk_layernorm=True,
        hidden_dropout=0.0,
        attention_dropout=0.0,
        params_dtype=params_dtype,
        use_cpu_initialization=True,
        perform_initialization=False,  # the converter loads every weight
        # Fused kernels are CUDA (and Apex/TE) only; the unfused paths compute the same functions.
        bias_activation_fusion=False,
        masked_softmax_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        gradient_accumulation_fusion=False,
        bias_dropout_fusion=False,
        attention_softmax_in_fp32=True,
        tensor_model_parallel_size=_tp_size(),
        pipeline_model_parallel_size=pp,
        # Between stages: hidden states in the parameters' dtype, shapes sent ahead of every tensor (packed
        # micro-batches differ in rows and width), plain isend/irecv pairs (what gloo runs), and the loss
        # function's sum taken as it is (the GRPO step already divides by the batch's loss tokens).
        pipeline_dtype=params_dtype,
        variable_seq_lengths=True,
        batch_p2p_comm=False,
        calculate_per_token_loss=True,
        moe_token_dispatcher_type="alltoall",  # no experts; the default ("allgather") refuses variable lengths
    )
    spec = get_gpt_layer_local_spec(qk_layernorm=True, normalization="RMSNorm")
    return GPTModel(
        cfg,
        spec,
        vocab_size=layout.vocab,
        max_sequence_length=layout.max_positions,
        pre_process=parallel_state.is_pipeline_first_stage(),
        post_process=parallel_state.is_pipeline_last_stage(),
        share_embeddings_and_output_weights=layout.tied and pp == 1,
        position_embedding_type="rope",
        rotary_base=layout.rope_theta,
    )


def _tp_size() -> int:
    from megatron.core import parallel_state

    return int(parallel_state.get_tensor_model_parallel_world_size())


def rope_angles(position_ids: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """Rotary angles ``[s, b, 1, head_dim]`` for per-token positions ``[b, s]`` (the halves repeated, the
    non-interleaved layout Megatron's ``apply_rotary_pos_emb`` and Hugging Face's Qwen3 use)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))
    freqs = position_ids.t().float()[..., None] * inv_freq.to(position_ids.device)  # [s, b, hd/2]
    return torch.cat([freqs, freqs], dim=-1)[:, :, None, :]


def packed_causal_mask(position_ids: torch.Tensor) -> torch.Tensor:
    """``[b, 1, s, s]`` bool, True where attention is *masked*: later tokens and other streams of the row
    (a stream starts where the position id is 0)."""
    seg = torch.cumsum((position_ids == 0).to(torch.int64), dim=1)  # [b, s]
    s = position_ids.shape[1]
    causal = torch.ones(s, s, dtype=torch.bool, device=position_ids.device).tril()
    allowed = causal[None] & (seg[:, :, None] == seg[:, None, :])
    return ~allowed[:, None]


class MegatronTokenLogprobs(nn.Module):
    """Logprob (and entropy) of chosen next tokens at chosen positions of packed rows, on a ``GPTModel``.

    The output layer runs only on the positions that predict agent tokens; with tensor parallelism its
    vocabulary-parallel logits are gathered (the all-gather's backward hands each rank its slice), so the
    logprob and entropy are computed exactly as in the Hugging Face wrapper.

    ``forward`` runs a whole model (pipeline size 1). Under pipeline parallelism the schedule calls the two
    halves: :meth:`hidden_states` on every stage, :meth:`logprobs` on the last.
    """

    def __init__(self, gpt: nn.Module, layout: Qwen3Layout) -> None:
        super().__init__()
        self.gpt = gpt
        self.layout = layout

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        pred_rows: torch.Tensor,
        pred_cols: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        hidden = self.hidden_states(input_ids, position_ids)
        return self.logprobs(hidden, pred_rows, pred_cols, targets, temperature, with_entropy)

    def hidden_states(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        """This stage's decoder output ``[s, b, h]`` (the final RMSNorm included on the last stage). The first
        stage embeds ``input_ids``; the others start from the tensor the schedule gave ``set_input_tensor``."""
        gpt: Any = self.gpt
        hidden = gpt.embedding(input_ids=input_ids, position_ids=position_ids) if gpt.pre_process else None
        rope = rope_angles(position_ids, self.layout.head_dim, self.layout.rope_theta).to(gpt.config.params_dtype)
        return gpt.decoder(hidden_states=hidden, attention_mask=packed_causal_mask(position_ids), rotary_pos_emb=rope)

    def logprobs(
        self,
        hidden: torch.Tensor,
        pred_rows: torch.Tensor,
        pred_cols: torch.Tensor,
        targets: torch.Tensor,
        temperature: float = 1.0,
        with_entropy: bool = True,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Logprob (and entropy) of ``targets`` from the last stage's hidden states."""
        from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

        gpt: Any = self.gpt
        h = hidden[pred_cols, pred_rows]  # [N, h] ([s, b] layout)
        weight = gpt.shared_embedding_or_output_weight() if gpt.share_embeddings_and_output_weights else None
        local_logits, _ = gpt.output_layer(h[None], weight=weight)  # [1, N, V/tp]
        logits = gather_from_tensor_model_parallel_region(local_logits)[0].float()
        if temperature != 1.0:
            logits = logits / temperature
        logz = torch.logsumexp(logits, dim=-1)
        logp = logits.gather(-1, targets[:, None]).squeeze(-1) - logz
        entropy = None
        if with_entropy:
            with torch.no_grad():
                probs = torch.softmax(logits, dim=-1)
                entropy = logz - (probs * logits).sum(-1)
        return logp, entropy
