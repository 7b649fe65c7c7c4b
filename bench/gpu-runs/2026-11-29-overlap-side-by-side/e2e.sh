# Side by side: cvc train on the GPU with and without the next batch staged during the step.
for i in 1 2; do
  for ov in 1 0; do
    rm -rf /tmp/s; CVC_OVERLAP=$ov .gpu/cvc train examples/seed_cnn.cvnn --device cuda --epochs 6 --batch 1024 --out /tmp/s -q >/dev/null 2>&1
    python3 -c "
import json,statistics; r=[json.loads(l) for l in open('/tmp/s/metrics.jsonl')]; v=[x['step_ms'] for x in r]; sps=[x['samples_per_s'] for x in r]
print('overlap=$ov run $i: per-epoch step_ms', [round(x,2) for x in v], 'median %.2f' % statistics.median(v), 'samples/s median %.0f' % statistics.median(sps))"
  done
done
