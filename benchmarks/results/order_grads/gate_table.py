import json, glob, statistics, collections, sys
d0 = sys.argv[1] if len(sys.argv) > 1 else '/work/bits/s50/gate'
rows = collections.defaultdict(lambda: {0: [], 1: []})
for f in sorted(glob.glob(f'{d0}/r*_v*/results.json')):
  v = int(f.split('_v')[1][0])
  res = json.load(open(f))['results']
  plain = {r['model']: r['step_time_s'] for r in res if r['setting'] == 'plain'}
  for r in res:
    if r['setting'] != 'plain':
      rows[(r['model'], r['setting'])][v].append(r['step_time_s'] / plain[r['model']])
print('| model | setting | over plain, without (median) | with | rounds without | rounds with |')
print('|---|---|---|---|---|---|')
for (m, s), d in rows.items():
  f = lambda xs: ', '.join(f'{x:.3f}' for x in xs)
  med = lambda xs: statistics.median(xs) if xs else float('nan')
  print(f'| {m} | {s} | {med(d[0]):.3f} | {med(d[1]):.3f} | {f(d[0])} | {f(d[1])} |')
