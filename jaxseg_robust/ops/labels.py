"""Label values shared by every layer: click labels of a prompt and the ignore value of a ground truth.

Click labels (`jaxseg_robust.prompts.types.Prompts.labels`, the renderers of
`jaxseg_robust.ops.render`): 1 positive click, 0 negative click, -1 an unused
(padding) slot. Ground-truth maps (`jaxseg_robust.data.instances`): 1 object,
0 background, -1 ignore (and outside the image in a padded frame).
"""

POSITIVE_LABEL = 1
NEGATIVE_LABEL = 0
PADDING_LABEL = -1
IGNORE_LABEL = -1

__all__ = ["POSITIVE_LABEL", "NEGATIVE_LABEL", "PADDING_LABEL", "IGNORE_LABEL"]
