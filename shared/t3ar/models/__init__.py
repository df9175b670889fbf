"""Models: backbones, the classifier (backbone -> bottleneck -> WeightNorm head) and the checkpoint format."""
