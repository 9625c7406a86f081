"""One rank of tools/torch_peer: a built-in model under torch's pipelining.

Run by tools/torch_peer.py with the torch interpreter (--torch_python), one
process per rank, never by hand:

  RANK=0 WORLD_SIZE=2 python tools/torch_peer_worker.py '{"port": 29500,
      "model": {"layer": "fc", "num_layers": 16, "dim": 1024, "batch": 64,
      "image_size": 0}, "schedule": "1f1b", "num_micro_batches": 4,
      "recompute": false, "steps": 20, "warmup": 3}'

It needs only torch (imported inside `RunRank`, so the pure helpers below
import without it: tools/torch_peer and its test use them). The model is
tools/benchmark's built-in one (settings.BuiltinModel's fields, sent by the
tool): `num_layers` layers relu(x @ W + b) or relu(conv3x3, no bias), cut
into K v equal stages, placed on the ranks as the schedule wants (`RankStages`),
trained with the mean of the last output as loss (per micro-batch, averaged:
scale_grads) and SGD at the learning rate. Each timed step starts after a
barrier; rank 0 prints the median over steps of the slowest rank's time as
one line starting with RESULT_PREFIX (JSON), with every rank's compute order.
"""

import json
import os
import statistics
import sys
import time
from typing import Any, Dict, List, Sequence, Tuple

RESULT_PREFIX = 'TORCH_PEER_RESULT '

# TensorPipe schedule -> (torch.distributed.pipelining class, stages per rank,
# placement): 'loop' puts stage s on rank s % K, 'v' puts stages r and
# 2 K - 1 - r on rank r (torch's style="v", TensorPipe's zb_v).
TORCH_SCHEDULES: Dict[str, Tuple[str, int, str]] = {
    'gpipe': ('ScheduleGPipe', 1, 'loop'),
    '1f1b': ('Schedule1F1B', 1, 'loop'),
    'interleaved_1f1b': ('ScheduleInterleaved1F1B', 2, 'loop'),
    # torch's ZB1P with one stage per rank: ZB-H1 (the order check of
    # tools/torch_peer compares the two tables).
    'zb_h1': ('ScheduleInterleavedZeroBubble', 1, 'loop'),
    'zb_v': ('ScheduleZBVZeroBubble', 2, 'v'),
}


def StageBounds(num_layers: int, num_stages: int) -> List[Tuple[int, int]]:
  """[start, end) layer indices of `num_stages` equal stages.

  Raises:
    ValueError: `num_layers` is not a multiple of `num_stages`.
  """
  if num_stages < 1 or num_layers % num_stages:
    raise ValueError(f'{num_layers} layers do not cut into {num_stages} equal '
                     'stages; use a number of stages that divides them')
  n = num_layers // num_stages
  return [(s * n, (s + 1) * n) for s in range(num_stages)]


def RankStages(num_ranks: int, stages_per_rank: int,
               placement: str) -> List[List[int]]:
  """Per rank, its stages in local order ('loop' or 'v'; see above)."""
  if placement == 'v':
    if stages_per_rank != 2:
      raise ValueError('a V placement holds 2 stages per rank')
    return [[r, 2 * num_ranks - 1 - r] for r in range(num_ranks)]
  return [[r + i * num_ranks for i in range(stages_per_rank)]
          for r in range(num_ranks)]


def _RecordActions(stage: Any, log: List[str]) -> None:
  """Appends each compute action `stage` runs to `log`, as torch's text
  ('<stage><op><micro-batch>': F forward, B full backward, I input
  gradient, W weight gradient)."""
  forward = stage.forward_one_chunk
  backward = stage.backward_one_chunk
  weight = stage.backward_weight_one_chunk

  def Forward(chunk, *args, **kwargs):
    log.append(f'{stage.stage_index}F{chunk}')
    return forward(chunk, *args, **kwargs)

  def Backward(chunk, *args, **kwargs):
    full = kwargs.get('full_backward', args[1] if len(args) > 1 else True)
    log.append(f'{stage.stage_index}{"B" if full else "I"}{chunk}')
    return backward(chunk, *args, **kwargs)

  def Weight(chunk, *args, **kwargs):
    log.append(f'{stage.stage_index}W{chunk}')
    return weight(chunk, *args, **kwargs)

  stage.forward_one_chunk = Forward
  stage.backward_one_chunk = Backward
  stage.backward_weight_one_chunk = Weight


def RunRank(request: Dict[str, Any], rank: int, world: int) -> Dict[str, Any]:
  """Builds this rank's stages and times the training steps."""
  # pylint: disable=g-import-not-at-top
  import torch
  import torch.distributed as dist
  from torch.distributed import pipelining
  from torch.utils import checkpoint
  # pylint: enable=g-import-not-at-top

  torch.set_num_threads(1)
  dist.init_process_group(
      'gloo', init_method=f'tcp://127.0.0.1:{request["port"]}', rank=rank,
      world_size=world)
  spec = request['model']
  cls_name, v, placement = TORCH_SCHEDULES[request['schedule']]
  t = request['num_micro_batches']
  bounds = StageBounds(spec['num_layers'], world * v)
  mine = RankStages(world, v, placement)[rank]
  torch.manual_seed(1234)
  if spec['layer'] == 'conv3x3':
    shape = [spec['batch'], spec['dim'], spec['image_size'],
             spec['image_size']]  # NCHW

    def Layer():
      return [torch.nn.Conv2d(spec['dim'], spec['dim'], 3, padding=1,
                              bias=False), torch.nn.ReLU()]
  else:
    shape = [spec['batch'], spec['dim']]

    def Layer():
      return [torch.nn.Linear(spec['dim'], spec['dim']), torch.nn.ReLU()]
  layers = [torch.nn.Sequential(*Layer()) for _ in range(spec['num_layers'])]

  class Stage(torch.nn.Module):
    """Layers [start, end), optionally recomputed in the backward pass."""

    def __init__(self, start, end):
      super().__init__()
      self.body = torch.nn.Sequential(*layers[start:end])

    def forward(self, x):
      if request['recompute']:
        return checkpoint.checkpoint(self.body, x, use_reentrant=False)
      return self.body(x)

  stages, params, actions = [], [], []
  for s in mine:
    module = Stage(*bounds[s])
    params += list(module.parameters())
    # Shapes inferred on the first step (a warm-up step).
    stages.append(pipelining.PipelineStage(module, s, world * v,
                                           torch.device('cpu')))
    _RecordActions(stages[-1], actions)

  def Loss(output, unused_target):
    return output.mean()

  cls = getattr(pipelining, cls_name)
  sched = cls(stages[0] if cls_name in ('ScheduleGPipe', 'Schedule1F1B')
              else stages, n_microbatches=t, loss_fn=Loss)
  opt = torch.optim.SGD(params, lr=request.get('learning_rate', 1e-3))
  gen = torch.Generator().manual_seed(1)
  x = torch.rand(shape, generator=gen)
  target = torch.zeros(shape[0])
  first, last = 0 in mine, world * v - 1 in mine

  def Step():
    args = (x,) if first else ()
    kwargs = {'target': target} if last else {}
    sched.step(*args, **kwargs)
    opt.step()
    opt.zero_grad()

  times = []
  for i in range(request['warmup'] + request['steps']):
    dist.barrier()
    del actions[:]  # The last step's order is kept.
    start = time.perf_counter()
    Step()
    if i >= request['warmup']:
      times.append(time.perf_counter() - start)
  slowest = torch.tensor(times, dtype=torch.float64)
  dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
  orders = [None] * world
  dist.all_gather_object(orders, list(actions))
  dist.barrier()
  dist.destroy_process_group()
  return dict(step_time_s=statistics.median(slowest.tolist()),
              step_times_s=slowest.tolist(), torch_version=torch.__version__,
              torch_class=cls_name, stages_per_rank=v, rank_stages=RankStages(
                  world, v, placement), orders=orders)


def Main(argv: Sequence[str]) -> None:
  request = json.loads(argv[1])
  rank, world = int(os.environ['RANK']), int(os.environ['WORLD_SIZE'])
  result = RunRank(request, rank, world)
  if rank == 0:
    sys.stdout.write(RESULT_PREFIX + json.dumps(result) + '\n')
    sys.stdout.flush()


if __name__ == '__main__':
  Main(sys.argv)
