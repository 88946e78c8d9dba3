"""Habana's default autocast op lists: a fact about Habana's software, the same on a Gaudi and on the emulated Gaudi.

Habana's bridge (hpu_ops/autocast_helpers, release 1.19) compiles these lists in and exposes them to no Python
module; a file named by PT_HPU_AUTOCAST_LOWER_PRECISION_OPS_LIST / PT_HPU_AUTOCAST_FP32_OPS_LIST replaces one of them.
core reads them to warn about op lists that cannot take effect (either backend); the emulated device installs them.
Plain data: importing this module touches no device and imports no torch.
"""

from __future__ import annotations

# Ops that run in the autocast dtype (bf16 / fp16).
DEFAULT_LOWER_OPS = frozenset({
    "addmm", "addbmm", "batch_norm", "baddbmm", "bmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
    "conv_transpose2d", "conv_transpose3d", "dot", "dropout", "feature_dropout", "group_norm", "instance_norm",
    "layer_norm", "leaky_relu", "linear", "matmul", "mean", "mm", "mul", "mv", "softmax", "log_softmax",
    "scaled_dot_product_attention",
})
# Ops that run in float32 under autocast.
DEFAULT_FP32_OPS = frozenset({
    "acos", "addcdiv", "asin", "atan2", "bilinear", "binary_cross_entropy", "binary_cross_entropy_with_logits",
    "cdist", "cosh", "cosine_embedding_loss", "cosine_similarity", "cross_entropy_loss", "dist", "div", "divide",
    "embedding", "embedding_bag", "erfinv", "exp", "expm1", "hinge_embedding_loss", "huber_loss", "kl_div",
    "l1_loss", "log", "log10", "log1p", "log2", "logsumexp", "margin_ranking_loss", "mse_loss", "multi_margin_loss",
    "multilabel_margin_loss", "nll_loss", "pdist", "poisson_nll_loss", "pow", "reciprocal", "renorm", "rsqrt",
    "sinh", "smooth_l1_loss", "soft_margin_loss", "softplus", "tan", "topk", "triplet_margin_loss", "truediv",
    "true_divide",
})

__all__ = ["DEFAULT_FP32_OPS", "DEFAULT_LOWER_OPS"]
