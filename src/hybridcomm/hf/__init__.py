"""Hugging Face transformers MoE models (Qwen3-MoE, Mixtral, DeepSeek-V3) as DP attention x
EP MoE through hybridcomm. Needs the optional extra: pip install "hybridcomm[hf]".

    comm = hc.Communicator(hc.Layout(4, attn_tp=2))
    model = hf.from_config(config, comm, seed=0)          # or hf.parallelize(hf_model, comm)
    decoder = hf.Decoder(model, slots=8, max_len=64)
    logits = decoder.prefill(prompts)                     # this DP group's sequences
    logits = decoder.step(next_tokens)                    # one decode step
"""

from .cache import StaticCache
from .driver import Decoder
from .families import FAMILIES, Family, UnsupportedModel, family_of
from .model import ParallelCausalLM
from .parallel import from_config, from_pretrained, parallelize, reference_model
from .weights import CheckpointWeights, ModelWeights, RandomWeights

__all__ = ["StaticCache", "Decoder", "FAMILIES", "Family", "UnsupportedModel", "family_of",
           "ParallelCausalLM", "from_config", "from_pretrained", "parallelize", "reference_model",
           "CheckpointWeights", "ModelWeights", "RandomWeights"]
