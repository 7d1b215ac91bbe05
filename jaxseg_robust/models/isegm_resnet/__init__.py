"""isegm's ResNetV1b backbone and DeepLabV3+ pieces, shared by the isegm DeepLab families (CDNet, GPCIS).

`resnetv1b`: the dilated ResNet-18/34/50/101/152 (output stride 8) with the
coordinate features added after the stem; `deeplab_plus`: ASPP, separable
convolutions, skip projection, heads and the DeepLabV3Plus feature extractor.
Parameters are torch-named (`jaxseg_robust.models.clickmap.layers`).
"""
