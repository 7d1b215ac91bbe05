"""TranSalNet (ResNet-50 variant), the saliency model of RClicks' SM click-model baseline.

`config` holds the static configuration, `network` the Flax network and the loading of
converted weights, `click_model` the SM construction around it (a click model of the
simulated user), `registry` its zoo family and names; ``ports/transalnet.py`` converts the
official checkpoint. See docs/models/transalnet.md.
"""

from jaxseg_robust.models.saliency.click_model import SaliencyClickModel, sm_clickability
from jaxseg_robust.models.saliency.config import FAMILY, TINY, TRANSALNET_RES, TranSalNetConfig
from jaxseg_robust.models.saliency.network import COLLECTIONS, TranSalNet, load_converted

__all__ = ["COLLECTIONS", "FAMILY", "TINY", "TRANSALNET_RES", "SaliencyClickModel", "TranSalNet",
           "TranSalNetConfig", "load_converted", "sm_clickability"]
