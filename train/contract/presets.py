"""Model shapes by name; pure data, so the launcher can size models without importing torch (the data
sections' keys are train.contract.sections' dataclass fields)."""


def llama3_rope(original_max: int) -> dict:
    """Llama-3.1's RoPE scaling (factor 8) around an original context of `original_max` tokens."""
    return {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
            "original_max_position_embeddings": original_max}


def flops_per_token(vocab_size: int, hidden_size: int, layers: int, params: int, seq_len: int) -> float:
    """Training FLOPs per token: 6 per matmul weight (embedding lookup excluded) plus attention scores. Pure
    arithmetic, so the planner (launcher.placement.steptime) and the trainer's MFU share it."""
    return 6 * (params - vocab_size * hidden_size) + 12 * layers * hidden_size * seq_len


PRESETS: dict[str, dict] = {
    # Llama-3.1-8B: 8,030,261,248 parameters.
    "llama3_8b": dict(vocab_size=128256, hidden_size=4096, num_hidden_layers=32, num_attention_heads=32,
                      num_key_value_heads=8, intermediate_size=14336, max_position_embeddings=131072,
                      rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
                      rope_scaling=llama3_rope(8192)),
    # Tests: a few ms per step on CPU.
    "tiny": dict(vocab_size=512, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                 intermediate_size=128, max_position_embeddings=2048, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, rope_scaling=llama3_rope(256)),
    # Local sweeps: ~5 M parameters (20 MB fp32), so communication is visible next to compute.
    "small": dict(vocab_size=4096, hidden_size=256, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                  intermediate_size=704, max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                  tie_word_embeddings=False, rope_scaling=llama3_rope(512)),
    # The testbed: ~2.4 M parameters (9.6 MB fp32), so shaped links dominate the step.
    "mini": dict(vocab_size=2048, hidden_size=192, num_hidden_layers=4, num_attention_heads=6, num_key_value_heads=3,
                 intermediate_size=512, max_position_embeddings=4096, rope_theta=500000.0, rms_norm_eps=1e-5,
                 tie_word_embeddings=False, rope_scaling=llama3_rope(512)),
}
