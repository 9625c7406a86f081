"""Image preprocessing of the GPipe paper's image experiments.

Huang et al. 2018 (arXiv 1811.06965), section 3 and supplement: ImageNet and
transfer-learning images are randomly cropped and resized, flipped left-right,
and (CIFAR, transfer sets) regularised with cutout. Every random function here
is *stateless*: it takes a `seed` tensor of shape [2] (int32/int64), so the same
seed gives the same image on any run, which keeps training resumable and
reproducible. Inputs derive one seed per example (see BaseInput._Finish).

All functions take one image [height, width, channels] (any float or integer
dtype unless noted) and return one image; map them over a tf.data.Dataset
before batching.
"""

from typing import Sequence, Tuple

import tensorflow as tf

# ImageNet channel statistics on [0, 1] RGB images (the usual values).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STDDEV = (0.229, 0.224, 0.225)


def _SubSeed(seed: tf.Tensor, salt: int) -> tf.Tensor:
  """A different stateless seed [2] for each use of one example's seed."""
  seed = tf.cast(seed, tf.int64)
  return tf.stack([seed[0], seed[1] * 7919 + salt])


def RandomHorizontalFlip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
  """Flips `image` [h, w, c] left-right with probability 1/2."""
  return tf.image.stateless_random_flip_left_right(image, _SubSeed(seed, 1))


def RandomCrop(image: tf.Tensor, size: Tuple[int, int], padding: int,
               seed: tf.Tensor) -> tf.Tensor:
  """Zero-pads `image` by `padding` pixels per side, then crops `size`.

  The CIFAR recipe: pad 4, crop 32x32 at a uniformly random offset.

  Args:
    image: [h, w, c].
    size: (crop_height, crop_width); must fit in the padded image.
    padding: pixels of zeros added on each of the four sides (>= 0).
    seed: [2] stateless seed.

  Returns:
    [crop_height, crop_width, c], same dtype.
  """
  if padding < 0:
    raise ValueError(f'padding={padding!r} must be >= 0')
  if padding:
    image = tf.pad(image, [[padding, padding], [padding, padding], [0, 0]])
  channels = tf.shape(image)[-1]
  return tf.image.stateless_random_crop(
      image, tf.stack([size[0], size[1], channels]), _SubSeed(seed, 2))


def Cutout(image: tf.Tensor, size: int, seed: tf.Tensor) -> tf.Tensor:
  """Zeroes a `size` x `size` square centred at a random pixel (DeVries 2017).

  The square is clipped at the image border, so near an edge fewer pixels are
  cut, as in the original cutout.

  Args:
    image: [h, w, c].
    size: side of the square in pixels; 0 returns the image unchanged.
    seed: [2] stateless seed.

  Returns:
    [h, w, c], same dtype.
  """
  if size < 0:
    raise ValueError(f'cutout size={size!r} must be >= 0')
  if size == 0:
    return image
  h, w = tf.shape(image)[0], tf.shape(image)[1]
  center = tf.random.stateless_uniform(
      [2], _SubSeed(seed, 3), minval=0, maxval=tf.int32.max, dtype=tf.int32)
  cy = center[0] % h
  cx = center[1] % w
  y0 = tf.maximum(cy - size // 2, 0)
  y1 = tf.minimum(cy - size // 2 + size, h)
  x0 = tf.maximum(cx - size // 2, 0)
  x1 = tf.minimum(cx - size // 2 + size, w)
  rows = tf.range(h)[:, None]
  cols = tf.range(w)[None, :]
  inside = (rows >= y0) & (rows < y1) & (cols >= x0) & (cols < x1)
  keep = tf.cast(tf.logical_not(inside), image.dtype)[:, :, None]
  return image * keep


def Resize(image: tf.Tensor, size: Tuple[int, int]) -> tf.Tensor:
  """Bilinear resize of `image` [h, w, c] to [size[0], size[1], c] float32."""
  return tf.image.resize(tf.cast(image, tf.float32), size, method='bilinear')


def RandomResizedCrop(image: tf.Tensor, size: Tuple[int, int],
                      seed: tf.Tensor,
                      area_range: Tuple[float, float] = (0.08, 1.0),
                      aspect_ratio_range: Tuple[float, float] = (3 / 4, 4 / 3)
                      ) -> tf.Tensor:
  """Inception-style crop of a random area and aspect ratio, resized to `size`.

  The ImageNet training crop (Szegedy et al. 2015) used by AmoebaNet/GPipe.

  Args:
    image: [h, w, c].
    size: output (height, width).
    seed: [2] stateless seed.
    area_range: fraction of the image area the crop covers.
    aspect_ratio_range: width / height of the crop.

  Returns:
    [size[0], size[1], c] float32.
  """
  begin, crop_size, _ = tf.image.stateless_sample_distorted_bounding_box(
      tf.shape(image), bounding_boxes=tf.constant([[[0., 0., 1., 1.]]]),
      seed=_SubSeed(seed, 4), min_object_covered=0.1,
      aspect_ratio_range=aspect_ratio_range, area_range=area_range,
      max_attempts=10, use_image_if_no_bounding_boxes=True)
  crop = tf.slice(image, begin, crop_size)
  return Resize(crop, size)


def CenterCrop(image: tf.Tensor, size: Tuple[int, int],
               crop_fraction: float = 0.875) -> tf.Tensor:
  """Evaluation crop: the central `crop_fraction` of the image, resized.

  Args:
    image: [h, w, c].
    size: output (height, width).
    crop_fraction: side fraction kept, in (0, 1].

  Returns:
    [size[0], size[1], c] float32.
  """
  if not 0 < crop_fraction <= 1:
    raise ValueError(f'crop_fraction={crop_fraction!r} must be in (0, 1]')
  return Resize(tf.image.central_crop(image, crop_fraction), size)


def Normalize(image: tf.Tensor, mean: Sequence[float],
              stddev: Sequence[float]) -> tf.Tensor:
  """(image / 255 - mean) / stddev per channel, for uint8-range images.

  Args:
    image: [h, w, c] with values in [0, 255].
    mean: c per-channel means of the [0, 1]-scaled image.
    stddev: c per-channel standard deviations of the [0, 1]-scaled image.

  Returns:
    [h, w, c] float32.
  """
  image = tf.cast(image, tf.float32) / 255.0
  return (image - tf.constant(mean, tf.float32)) / tf.constant(
      stddev, tf.float32)
