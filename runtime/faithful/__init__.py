"""The faithful-text layer: segmentation, protected spans, masking and restoring (torch-free)."""
