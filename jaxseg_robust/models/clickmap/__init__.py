"""Click-map interactive models (RITM, SimpleClick, CFR-ICL): shared pieces.

The Segmenter (`segmenter`), the click-map rendering (`encoding`), the isegm
inference machinery (`zoom_in`, `isegm`), the authors' NoC loop (`noc`), the
predictor and the zoo registration. Families: `jaxseg_robust.models.ritm`,
`jaxseg_robust.models.simpleclick`. See docs/models/click_models.md.
"""
