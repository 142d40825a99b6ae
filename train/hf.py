"""transformers' Llama, attention registry and causal-LM loss, imported without SciPy: whenever SciPy is installed,
transformers imports scipy.optimize for its object-detection loss's box matcher, about 0.3 s of CPU in every rank's
start that no step here uses. train/ takes these names from here, so the flag is set before that first import."""
import transformers.utils

transformers.utils.is_scipy_available = lambda: False  # read by transformers.loss once, when it is first imported

from transformers import AttentionInterface, LlamaForCausalLM  # noqa: E402
from transformers.loss.loss_utils import ForCausalLMLoss  # noqa: E402

__all__ = ["AttentionInterface", "ForCausalLMLoss", "LlamaForCausalLM"]
