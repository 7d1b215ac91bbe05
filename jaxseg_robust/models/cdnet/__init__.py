"""CDNet (ClickSEG's ``DeeplabModel`` with FDM and PDM) as a click-map family: docs/models/cdnet.md."""
