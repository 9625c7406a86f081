"""Temperature sampling of several data sets (GPipe paper, section 5).

The multilingual experiments of Huang et al. 2018 (following Arivazhagan et
al. 2019) draw each example from language pair l with probability

  p_l  proportional to  (D_l / sum_k D_k) ** (1 / T),

where D_l is the number of examples of pair l and T the temperature: T = 1 is
sampling in proportion to size, T -> infinity is uniform; the paper uses T = 5.
"""

from typing import List, Sequence


def TemperatureSamplingWeights(sizes: Sequence[int],
                               temperature: float = 5.0) -> List[float]:
  """Sampling probabilities p_l ~ (D_l / sum D)^(1/T), summing to 1.

  Args:
    sizes: D_l, the example count of each data set (> 0).
    temperature: T > 0.

  Returns:
    One probability per data set, in the order of `sizes`.

  Raises:
    ValueError: no sizes, a size <= 0, or temperature <= 0.
  """
  if not sizes:
    raise ValueError('sizes=[] must name at least one data set size')
  if any(d <= 0 for d in sizes):
    raise ValueError(f'sizes={list(sizes)!r} must all be > 0; drop empty data '
                     'sets before sampling')
  if temperature <= 0:
    raise ValueError(f'temperature={temperature!r} must be > 0 (the paper '
                     'uses 5)')
  total = float(sum(sizes))
  raw = [(d / total)**(1.0 / temperature) for d in sizes]
  norm = sum(raw)
  return [r / norm for r in raw]
