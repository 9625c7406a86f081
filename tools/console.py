"""A console a first-time user can read: TensorFlow's and TFDS's own lines off.

A healthy run of a binary otherwise starts with TensorFlow's C++ start-up
lines (the oneDNN notice, "Could not find cuda drivers", an
`E0000 ... failed call to cuInit` error line on a machine without a GPU,
the CPU feature notice), then TFDS's INFO lines for every data set read
("Load dataset info", "Creating a tf.data.Dataset") and a TensorFlow
"Sharding callback duration" line per checkpoint. An error line on a healthy
run teaches users to ignore error lines.

Import this module first in a binary, before anything imports TensorFlow:

  from tools import console  # pylint: disable=unused-import  (first)
  ...
  def _Main(argv):
    console.QuietPythonLogs()

On import, unless --tf_logs is given, it sets TF_CPP_MIN_LOG_LEVEL=3
(TensorFlow's C++ logging off; TF reads it once, when it loads) where the
user has not set it, and imports TensorFlow with the notices its libraries
print while loading (which no log level silences) dropped from stderr.
`QuietPythonLogs` (after absl parsed the flags) drops
INFO lines of TensorFlow, Keras and TFDS, keeping their warnings and
errors and every line of TensorPipe's own. Errors TensorFlow reports to
Python (a failed op, a dead worker) still reach the user: the binaries print
them as `<tool>: error: ...`.
"""

import logging
import os
import sys

from absl import flags

from tensorpipe import errors

_FLAG = 'tf_logs'
flags.DEFINE_bool(_FLAG, False, "Show TensorFlow's C++ log lines and the INFO "
                  'lines of TensorFlow, Keras and TFDS (off by default: a '
                  'healthy run prints only its own lines and real '
                  'warnings). TF_CPP_MIN_LOG_LEVEL, if set, is honoured.')

# Modules whose INFO lines are dropped (by the path of the logging call).
_QUIET_PATHS = tuple(f'{os.sep}{name}{os.sep}' for name in (
    'tensorflow', 'tensorflow_datasets', 'keras', 'tf_keras'))


def _AskedForLogs(argv) -> bool:
  """Whether argv holds --tf_logs (or --tf_logs=true / 1)."""
  for arg in argv[1:]:
    if arg == '--':
      break
    if arg in (f'--{_FLAG}', f'--{_FLAG}=true', f'--{_FLAG}=True',
               f'--{_FLAG}=1'):
      return True
  return False


# What TensorFlow's shared libraries print while they load, whatever
# TF_CPP_MIN_LOG_LEVEL says (absl logs them before TF sets its level).
_LOAD_NOTICES = (
    'All log messages before absl::InitializeLog() is called',
    'oneDNN custom operations are on',
    'Could not find cuda drivers on your machine',
    'This TensorFlow binary is optimized to use available CPU instructions',
    'To enable the following instructions:',
)


def _ImportTensorFlowQuietly() -> None:
  """Imports TensorFlow with its load notices dropped from stderr.

  The file descriptor is redirected (the notices come from C++); every
  other line written meanwhile is written again afterwards.
  """
  import tempfile  # pylint: disable=g-import-not-at-top
  sys.stderr.flush()
  saved = os.dup(2)
  with tempfile.TemporaryFile() as captured:
    os.dup2(captured.fileno(), 2)
    try:
      import tensorflow  # pylint: disable=g-import-not-at-top,unused-import
    finally:
      os.dup2(saved, 2)
      os.close(saved)
      captured.seek(0)
      text = captured.read().decode('utf-8', 'replace')
      for line in text.splitlines():
        if line.strip() and not any(n in line for n in _LOAD_NOTICES):
          sys.stderr.write(line + '\n')
      sys.stderr.flush()


def ConfigureNativeLogs(argv=None) -> None:
  """Before TF loads: its C++ logging off, its load notices dropped.

  Unless --tf_logs is given: TF_CPP_MIN_LOG_LEVEL=3 where the user has not
  set it, and TensorFlow imported with its load notices dropped.
  """
  if _AskedForLogs(sys.argv if argv is None else argv):
    return
  os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3')
  if 'tensorflow' not in sys.modules:
    _ImportTensorFlowQuietly()


class _DropLibraryInfo(logging.Filter):
  """Drops records below WARNING logged from TensorFlow, Keras or TFDS."""

  def filter(self, record: logging.LogRecord) -> bool:
    if record.levelno >= logging.WARNING:
      return True
    if record.name == 'tensorflow' or record.name.startswith('tensorflow.'):
      return False
    path = record.pathname or ''
    return not any(part in path for part in _QUIET_PATHS)


_FILTER = _DropLibraryInfo()


def QuietPythonLogs() -> None:
  """Drops the INFO lines of TensorFlow, Keras and TFDS (unless --tf_logs).

  Call after absl has parsed the flags (in the binary's main).
  """
  if flags.FLAGS.is_parsed() and getattr(flags.FLAGS, _FLAG):
    return
  logging.getLogger('tensorflow').setLevel(logging.WARNING)
  for logger in (logging.getLogger(), logging.getLogger('absl')):
    for handler in logger.handlers:
      if _FILTER not in handler.filters:
        handler.addFilter(_FILTER)
    if _FILTER not in logger.filters:
      logger.addFilter(_FILTER)


def OneLine(e: BaseException) -> str:
  """An error's message as one line, for a binary's `<tool>: error:` line.

  The whole message (errors.Message: without AutoGraph's "in user code:"
  frames), its lines joined; errors.FirstLine gives only the first.
  """
  return ' '.join(errors.Message(e).split()) or type(e).__name__


ConfigureNativeLogs()
