"""The three HyReC projectors (§3.1.4).

* :class:`WeightProjector` — ``W_i = log(1 + ReLU(w_w · l_i + b_w))`` (eq. 5), one weight per token.
* :class:`UnionProjector` — logits of ``U_i = softmax(W_u l_i + b_u)`` over ``{S, B, M, E}`` (eq. 4), or
  of a small MLP over a window of states (``context > 0``, for frozen lexicon encoders).
* :class:`DenseProjector` — ``D_vec = W_d d + b_d`` (eq. 6) after pooling and before ``Normalize``: the
  identity-initialised :class:`~medadapt.adapters.linear.LinearHead` with a bias, so an untrained projector
  returns the backbone's embedding exactly and the :class:`~medadapt.cache.EmbeddingCache` caches the
  backbone output before it and applies it on read.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from medadapt.adapters.linear import LinearHead
from medadapt.errors import ConfigError

__all__ = ["WeightProjector", "UnionProjector", "DenseProjector"]


class WeightProjector(nn.Module):
    """Term importance ``log(1 + ReLU(w · l + b))`` (eq. 5); input ``(..., H)``, output ``(...)``.

    With ``vocab_size`` a per-term bias ``b_t`` (zero-initialised) is added inside the ReLU: a learned
    IDF-like prior, an extension that is not in the paper (``HyReCConfig.term_bias``). :class:`HyReCModel`
    starts the bias at 1 so every valid term is active at first (no ReLU is dead before training)."""

    def __init__(self, hidden: int, init_bias: float = 0.0, vocab_size: int | None = None):
        super().__init__()
        self.linear = nn.Linear(hidden, 1)
        nn.init.constant_(self.linear.bias, init_bias)
        self.term_bias = None
        if vocab_size:
            self.term_bias = nn.Embedding(vocab_size, 1)
            nn.init.zeros_(self.term_bias.weight)

    def forward(self, states: Tensor, input_ids: Tensor | None = None) -> Tensor:
        logits = self.linear(states).squeeze(-1)
        if self.term_bias is not None:
            if input_ids is None:
                raise ValueError("this weight projector has a per-term bias: pass input_ids")
            logits = logits + self.term_bias(input_ids).squeeze(-1)
        return torch.log1p(F.relu(logits))


class UnionProjector(nn.Module):
    """Union logits over ``{S, B, M, E}`` (eq. 4 before the softmax); ``(..., T, H)`` -> ``(..., T, 4)``.

    ``context = 0`` is the paper's linear head on each token's lexicon state. ``context = k > 0`` (not in
    the paper) reads a window of ``2k + 1`` states around each token through a small GELU MLP: when the
    lexicon encoder is frozen it cannot learn the boundary features the union needs, so the head gets its
    own (local) context instead. Positions outside the text (``attention_mask`` 0) read as zeros.
    """

    def __init__(self, hidden: int, context: int = 0, inner: int = 256):
        super().__init__()
        if context < 0:
            raise ValueError("context must be >= 0")
        self.context = context
        if context == 0:
            self.linear = nn.Linear(hidden, 4)
        else:
            self.mlp = nn.Sequential(nn.Linear((2 * context + 1) * hidden, inner), nn.GELU(),
                                     nn.Linear(inner, 4))

    def forward(self, states: Tensor, attention_mask: Tensor | None = None) -> Tensor:
        if self.context == 0:
            return self.linear(states)
        if attention_mask is not None:
            states = states * attention_mask.unsqueeze(-1).to(states.dtype)
        k, T = self.context, states.shape[-2]
        padded = F.pad(states, (0, 0, k, k))
        window = torch.cat([padded[..., j : j + T, :] for j in range(2 * k + 1)], dim=-1)
        return self.mlp(window)


class DenseProjector(LinearHead):
    """The dense projector ``D = W_d d + b_d`` (eq. 6): a :class:`~medadapt.adapters.linear.LinearHead` with a
    bias, saved under this class path with the configuration HyReC folders have always held
    (``in_features``, ``out_features``, ``identity_init``); only the square, identity-initialised map."""

    config_keys: list[str] = ["in_features", "out_features", "identity_init"]

    def __init__(self, in_features: int, out_features: int | None = None, identity_init: bool = True):
        if out_features not in (None, in_features) or identity_init is not True:
            raise ConfigError(f"DenseProjector is square and identity-initialised (eq. 6 as HyReC uses it), got "
                              f"in_features={in_features}, out_features={out_features}, "
                              f"identity_init={identity_init}")
        super().__init__(in_features, bias=True)
        self.in_features = self.out_features = in_features
        self.identity_init = True
