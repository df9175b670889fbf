"""Weak t(x) and strong t'(x) views (AdaContrast's recipe), computed a batch at a time, drawn per image.

The distribution is torchvision's per-image pipeline (``RandomResizedCrop`` -> ``RandomHorizontalFlip`` for
the weak view; plus ``ColorJitter(0.4, 0.4, 0.4, 0.1)`` with p = 0.8 in a random order, ``RandomGrayscale``
with p = 0.2 and ``RandAugment(num_ops=2, magnitude=9)`` for the strong one), but every random parameter
is drawn per image into a tensor (:mod:`t3ar.method.view_params`) and the image operations run once per
batch on the batch's device (:mod:`t3ar.method.view_ops`):

* crop + resize + flip: one ``grid_sample`` with a per-image affine (bilinear, as the crop's resize);
* colour jitter and grayscale: at each of the 4 positions of the random order, one blend (brightness,
  contrast or saturation, each image its own op and factor) and one hue shift of the images whose op there
  is hue;
* RandAugment: each image draws its own 2 ops and signs; per round, one nearest-neighbour ``grid_sample`` for
  all the geometric ops (each image its op's grid), one blend for Brightness / Color / Contrast, one Sharpness,
  and torchvision's own functional op once for each of Posterize, Solarize, AutoContrast and Equalize.

Images stay float in [0, 1] from the first op on (torchvision rounds to uint8 after every op: a
difference of at most half a grey level per op). Randomness comes from the ``generator`` given (a CPU
generator, so a seed gives the same views on every device); parameters are tensors on the CPU, moved to
the device once per batch.
"""

from __future__ import annotations

import torch

from t3ar.method.augment import Normalizer
from t3ar.method.view_ops import colour, crop_flip, rand_augment
from t3ar.method.view_params import STRONG, WEAK, ViewParams, ViewSpec, cat_params, sample_params

# Memory layout per device type: views come out in it and the adaptation loop puts the model in it. Measured
# (Lite0, 64 px, batch 32): channels-last makes a CPU forward+backward 2.5x and a no-grad forward 1.7x faster;
# on an H100 under AMP it makes every step 1.9-2.5x slower. An entry may be switched off for an experiment.
CHANNELS_LAST: dict[str, bool] = {"cpu": True, "cuda": False}


def render(images: torch.Tensor, p: ViewParams, spec: ViewSpec) -> torch.Tensor:
    """The views of uint8 [B, 3, S, S] ``images`` with parameters ``p``: float in [0, 1], on images' device."""
    size = images.shape[-1]
    x = crop_flip(images.float().div_(255), p.boxes, p.flip, size)
    if spec.strong:
        x = rand_augment(colour(x, p), p)
    return x


class Views:
    """Normalised weak / strong views of uint8 batches on ``norm.device``, with their own random stream.

    Views come out in the device's layout (:data:`CHANNELS_LAST`).
    """

    def __init__(self, norm: Normalizer, generator: torch.Generator,
                 extra_generator: torch.Generator | None = None) -> None:
        self.norm = norm
        self.gen = generator
        self.extra_gen = extra_generator or generator  # draws the views of ``strong_with``'s extra images

    def _make(self, images: torch.Tensor, spec: ViewSpec, extra: torch.Tensor | None = None,
              gen: torch.Generator | None = None) -> torch.Tensor:
        if len(images) == 0 and extra is None:
            return torch.empty(0, *images.shape[1:], device=self.norm.device)
        p = sample_params(len(images), images.shape[-1], spec, gen or self.gen)
        if extra is not None:
            p = cat_params(p, sample_params(len(extra), extra.shape[-1], spec, self.extra_gen))
            images = torch.cat([images.to(self.norm.device, non_blocking=True),
                                extra.to(self.norm.device, non_blocking=True)])
        x = render(images.to(self.norm.device, non_blocking=True), p, spec)
        return self._layout(x.sub_(self.norm.mean).div_(self.norm.std))  # x is this call's own: in place

    def weak(self, images: torch.Tensor) -> torch.Tensor:
        return self._make(images, WEAK)

    def strong(self, images: torch.Tensor) -> torch.Tensor:
        return self._make(images, STRONG)

    def strong_with(self, images: torch.Tensor, extra: torch.Tensor) -> torch.Tensor:
        """Strong views of ``images`` then of ``extra``, rendered in one call; the extra images' parameters come
        from their own stream, so the views of ``images`` are what ``strong(images)`` would give (paired runs
        with and without extra images see the same target views)."""
        return self._make(images, STRONG, extra)

    def weak_with(self, images: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        """Weak views drawn from ``generator`` (a stream of the caller's: retrieved pool images as data), so
        making them changes no other view of the run."""
        return self._make(images, WEAK, gen=generator)

    def plain(self, images: torch.Tensor) -> torch.Tensor:
        """No augmentation: the evaluation transform."""
        return self._layout(self.norm(images))

    def _layout(self, x: torch.Tensor) -> torch.Tensor:
        if CHANNELS_LAST.get(self.norm.device.type, False):
            return x.contiguous(memory_format=torch.channels_last)
        return x

