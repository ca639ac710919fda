"""Oracle: reads a TensorBoard event file with the tensorboard package's own loader
(which verifies the TFRecord CRCs) and prints one JSON line per scalar: tag, step, value."""
import json
import sys

from tensorboard.backend.event_processing.event_file_loader import RawEventFileLoader
from tensorboard.compat.proto import event_pb2

records = 0
for raw in RawEventFileLoader(sys.argv[1]).Load():
    records += 1
    event = event_pb2.Event.FromString(raw)
    if event.HasField("file_version"):
        print(json.dumps({"file_version": event.file_version}))
    for v in event.summary.value:
        print(json.dumps({"tag": v.tag, "step": event.step, "value": v.simple_value}))
print(json.dumps({"records": records}))
