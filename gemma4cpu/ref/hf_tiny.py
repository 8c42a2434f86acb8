"""Tiny random Hugging Face models (transformers 5.24, CPU, float32, seeded) for reference tests.

Every builder returns a model in eval mode whose norm weights, layer scalars and router scales have
been randomised away from their initial value (1, or 0 for Gemma 3's `1 + w` norms): a norm or a
scale applied in the wrong place then changes the logits instead of hiding behind an identity.
`save(model, path)` writes config.json + model.safetensors (the input of gemma4cpu.convert).

Variants (all vocab 512, hidden 64, head_dim 32 (full 64: the C attention needs multiples of 32), sliding window 8 so a 20-token prompt crosses it):
  dense   Gemma 4, 7 layers [s s s s s F F], K=V on full layers, 1 global kv head, full head_dim 2x,
          proportional partial RoPE (factor 0.25), final softcap 30
  moe     Gemma 4, 6 layers [s s s s s F], router + 8 experts top-2 + always-on dense MLP, K=V
  e       Gemma 4 E-style, 10 layers 4:1 (full at 4, 9), per-layer embeddings (Dp 16), the last 5
          layers KV-shared (sliding ones read layer 3, full ones read layer 4, as in E2B), double-wide MLP
  gemma3  Gemma3ForCausalLM, 7 layers [s s s s s F s], query_pre_attn_scalar = head_dim
  assistant  Gemma4AssistantForCausalLM drafter for `dense` (4 layers [s s s F], hidden 32)
  assistant_e  the same for `e` (1 kv head), with the E2B/E4B centroid head: 32 clusters of 16
          tokens (a seeded random token_ordering permutation), top-4 clusters scored per step

Requires torch and transformers; nothing else in gemma4cpu imports this module.
"""
from __future__ import annotations

import torch

VOCAB = 512
HIDDEN = 64

# Weight init scale. At the HF default (0.02) the logits of a 64-wide model are nearly flat
# (top-1/top-2 margins ~1e-4, so any rounding flips the argmax); at ~0.3 the residual stream
# explodes and generation collapses into one repeated token. 0.08 gives logit spreads of a few
# units with distinct top-1 tokens (checked by printing margins while writing these builders).
INIT = 0.08


def _common_gemma4(**kw):
    from transformers import Gemma4TextConfig

    base = {
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": 128,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "global_head_dim": 64,
        "sliding_window": 8,
        "max_position_embeddings": 256,
        "final_logit_softcapping": 30.0,
        "hidden_size_per_layer_input": 0,
        "vocab_size_per_layer_input": 0,
        "initializer_range": INIT,
        "tie_word_embeddings": True,
    }
    base.update(kw)
    cfg = Gemma4TextConfig(**base)
    cfg._attn_implementation = "eager"
    return cfg


def _randomise(model, seed: int, gemma3: bool = False) -> None:
    """Move every norm weight, layer scalar and router scale away from its init, deterministically."""
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in sorted(model.named_parameters()) + sorted(model.named_buffers()):
            if "norm" in name and name.endswith("weight"):
                if gemma3:  # stored as w, used as (1 + w)
                    p.copy_(0.3 * torch.randn(p.shape, generator=g))
                elif "q_norm" in name or "k_norm" in name:
                    # Gemma 4 scores are q.k with unit-RMS q and k (attention scale 1): weights
                    # near 1 give scores up to ~head_dim = 32 and a near-one-hot softmax, which
                    # makes the model chaotic (a 0.4% weight perturbation flips top-1 at a third
                    # of positions); ~0.4 keeps scores at a few units, as trained models have
                    p.copy_(torch.empty(p.shape).uniform_(0.25, 0.55, generator=g))
                else:  # used as w
                    p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=g))
            elif name.endswith("layer_scalar"):
                p.copy_(torch.empty(p.shape).uniform_(0.4, 1.6, generator=g))
            elif name.endswith(("router.scale", "router.per_expert_scale")):
                p.copy_(torch.empty(p.shape).uniform_(0.5, 1.5, generator=g))


def _finish(model, seed: int, gemma3: bool = False):
    _randomise(model, seed, gemma3=gemma3)
    model.eval()
    model.generation_config.pad_token_id = 0
    model.generation_config.eos_token_id = None  # never stop early in tests
    return model


def gemma4_dense(seed: int = 0):
    """Gemma 4 dense, 7 layers (full at 5 and 6), K=V full layers, partial RoPE."""
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    types = ["sliding_attention"] * 5 + ["full_attention"] * 2  # what the 5:1 default + forced-last gives
    cfg = _common_gemma4(num_hidden_layers=7, layer_types=types, attention_k_eq_v=True, num_global_key_value_heads=1)
    return _finish(Gemma4ForCausalLM(cfg), seed)


def gemma4_moe(seed: int = 0):
    """Gemma 4 MoE, 6 layers (full at 5), 8 experts top-2, always-on dense MLP, K=V."""
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    cfg = _common_gemma4(
        num_hidden_layers=6,
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        enable_moe_block=True,
        num_experts=8,
        top_k_experts=2,
        moe_intermediate_size=32,
        intermediate_size=48,
    )
    return _finish(Gemma4ForCausalLM(cfg), seed)


def gemma4_e(seed: int = 0):
    """Gemma 4 E-style: 10 layers 4:1, PLE (Dp 16), last 5 layers KV-shared, double-wide MLP."""
    from transformers import Gemma4ForCausalLM

    torch.manual_seed(seed)
    types = ["full_attention" if (i + 1) % 5 == 0 else "sliding_attention" for i in range(10)]
    cfg = _common_gemma4(
        num_hidden_layers=10,
        layer_types=types,
        num_key_value_heads=1,
        hidden_size_per_layer_input=16,
        vocab_size_per_layer_input=VOCAB,
        num_kv_shared_layers=5,
        use_double_wide_mlp=True,
        intermediate_size=96,
    )
    return _finish(Gemma4ForCausalLM(cfg), seed)


def gemma3(seed: int = 0):
    """Gemma 3 text, 7 layers (full at 5), GQA 4/2, head_dim 32."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(seed)
    cfg = Gemma3TextConfig(
        vocab_size=VOCAB,
        hidden_size=HIDDEN,
        intermediate_size=128,
        num_hidden_layers=7,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        query_pre_attn_scalar=32,
        sliding_window=8,
        max_position_embeddings=256,
        initializer_range=INIT,
        tie_word_embeddings=True,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
            "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        },
    )
    cfg._attn_implementation = "eager"
    return _finish(Gemma3ForCausalLM(cfg), seed, gemma3=True)


def gemma4_assistant(seed: int = 0):
    """MTP assistant for the `dense` target (backbone hidden 64): 4 layers [s s s F], hidden 32,
    every layer KV-shared (reads the target's cache), kv heads / head dims matching the target."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    text = _common_gemma4(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        attention_k_eq_v=True,
        num_global_key_value_heads=1,
        final_logit_softcapping=None,
    )
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=HIDDEN)
    cfg._attn_implementation = "eager"
    m = Gemma4AssistantForCausalLM(cfg)
    m.generation_config.num_assistant_tokens = 3
    return _finish(m, seed)


def gemma4_assistant_e(seed: int = 0):
    """MTP assistant for the `e` target with the ordered-embedding (centroid) head of E2B/E4B
    (spec 4.5): 4 layers [s s s F], hidden 32, 1 kv head on both layer types as in `e`,
    32 centroids, top-4 clusters of 16 tokens scored per step."""
    from transformers import Gemma4AssistantConfig, Gemma4AssistantForCausalLM

    torch.manual_seed(seed)
    text = _common_gemma4(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=4,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        num_key_value_heads=1,
        final_logit_softcapping=None,
    )
    cfg = Gemma4AssistantConfig(text_config=text, backbone_hidden_size=HIDDEN, use_ordered_embeddings=True,
                                num_centroids=32, centroid_intermediate_top_k=4)
    cfg._attn_implementation = "eager"
    m = Gemma4AssistantForCausalLM(cfg)
    m.generation_config.num_assistant_tokens = 3
    # HF creates token_ordering with torch.empty and _init_weights zeroes it (every cluster = token 0);
    # a real checkpoint stores a permutation of the vocabulary. It is a persistent buffer (saved, I64).
    g = torch.Generator().manual_seed(seed + 2)
    me = m.masked_embedding
    with torch.no_grad():
        me.token_ordering.copy_(torch.randperm(VOCAB, generator=g))
        # centroid scores ~ N(0, 1.5): top-4 of 32 well separated beyond float32 noise
        me.centroids.weight.copy_(0.25 * torch.randn(me.centroids.weight.shape, generator=g))
    return _finish(m, seed)


BUILDERS = {"dense": gemma4_dense, "moe": gemma4_moe, "e": gemma4_e, "gemma3": gemma3,
            "assistant": gemma4_assistant, "assistant_e": gemma4_assistant_e}


def save(model, path) -> None:
    """config.json + model.safetensors into directory `path` (created)."""
    model.save_pretrained(str(path), safe_serialization=True)


def build(name: str, path, seed: int = 0):
    """Build variant `name`, save it to `path`, return the in-memory model."""
    m = BUILDERS[name](seed)
    save(m, path)
    return m
