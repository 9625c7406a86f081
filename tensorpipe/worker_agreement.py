"""Workers of a multi-worker run agree on what they run, before step 1.

Workers started with different Params or flags used to be caught late: a
different --max_steps left one worker waiting in a collective after the other
had finished, and a different learning rate surfaced only after the last step
as "replicas hold different weights". Before the first step every worker now
publishes one digest per key of its Params (task.train.max_steps included)
and of the flags that change the sequence of steps, and compares them with
every other worker's:

  mine = KeyDigests(params.ToText(), {'--seed': '1234', ...})
  CheckAgreement(worker_index, num_workers, mine, exchange)
    -> ValueError "the 2 workers disagree on task.train.max_steps (worker 0:
       10, worker 1: 12 ...)" on every worker

One digest per key, not one for everything: a single digest could say only
that something differs. The digests travel through TF's coordination service
key-value store (`StoreExchange` over run_life_cycle.CoordinationStore),
which every multi-worker run has.
"""

import hashlib
import json
from typing import Any, Callable, Dict, List, Mapping, Sequence

from tensorpipe import params_format

# The trainer flags that change which steps run and what they compute.
STEP_FLAGS = ('--seed', '--deterministic', '--mode', '--eval_steps',
              '--recompute_bn_stats')
_KEY_PREFIX = 'tensorpipe/worker_agreement/'


def _Digest(value: str) -> str:
  return hashlib.sha256(value.encode('utf-8')).hexdigest()[:16]


def KeyDigests(params_text: str, flags: Mapping[str, str]) -> Dict[str, str]:
  """{key: digest of its value} for every Params line and flag.

  Args:
    params_text: Params.ToText(), 'key : value' per line.
    flags: flag name -> value as text.
  """
  out = {key: _Digest(value)
         for key, value in params_format.TextValues(params_text).items()}
  for name, value in flags.items():
    out[name] = _Digest(str(value))
  return out


def DifferingKeys(every: Sequence[Mapping[str, str]]) -> List[str]:
  """Keys whose digest is not the same on every worker (or missing)."""
  keys = sorted(set().union(*[set(d) for d in every]))
  return [k for k in keys if len({d.get(k) for d in every}) > 1]


def StepFlagValues(flag_values: Any) -> Dict[str, str]:
  """{'--seed': '1234', ...}: the STEP_FLAGS of absl's FLAGS as text."""
  return {f: str(flag_values[f.lstrip('-')].value) for f in STEP_FLAGS}


def CheckAgreement(worker_index: int, num_workers: int,
                   digests: Mapping[str, str],
                   exchange: Callable[[int, str], List[str]],
                   values: Mapping[str, str] = None) -> None:
  """Raises on every worker if the workers' digests differ anywhere.

  Args:
    worker_index: this worker's index.
    num_workers: R.
    digests: this worker's KeyDigests.
    exchange: (worker_index, text) -> every worker's text, in worker order.
    values: this worker's values by key, quoted in the message.

  Raises:
    ValueError: one line naming the differing keys (at most 5, then a count)
      and this worker's values.
  """
  texts = exchange(worker_index, json.dumps(dict(digests), sort_keys=True))
  assert len(texts) == num_workers, (len(texts), num_workers)
  every = [json.loads(t) for t in texts]
  differ = DifferingKeys(every)
  if not differ:
    return
  values = values or {}
  shown = ', '.join(f'{k} (here: {values[k]})' if k in values else k
                    for k in differ[:5])
  more = f' and {len(differ) - 5} more' if len(differ) > 5 else ''
  raise ValueError(
      f'the {num_workers} workers were started with different settings: '
      f'{shown}{more} differ between workers (this is worker {worker_index}); '
      'start every worker with the same experiment, flags and '
      '--model_params_override')


def StoreExchange(store: Any, num_workers: int, timeout_s: float
                  ) -> Callable[[int, str], List[str]]:
  """An `exchange` through a key-value store shared by the workers.

  Each worker sets its own key and reads every other worker's, waiting up to
  `timeout_s` for each. `store`: Set(key, value) and Get(key, timeout_s),
  TF's coordination service store in a run
  (run_life_cycle.CoordinationStore), an in-memory one in tests.
  """

  def Exchange(worker_index: int, text: str) -> List[str]:
    store.Set(f'{_KEY_PREFIX}{worker_index}', text)
    return [text if r == worker_index else
            store.Get(f'{_KEY_PREFIX}{r}', timeout_s)
            for r in range(num_workers)]

  return Exchange

