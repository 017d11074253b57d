"""Measurements from a store, without the model: direct Sigma (sigma), the SAE sweep
trained or imported (sweep), AtP scores (score), epsilon and the counts (counts), the
saturating fits (fit), one sweep's numbers (analysis), CE loss recovered (splice, which
does run the model), the shared statistics (stats), and all of it for one layer (layer)."""
