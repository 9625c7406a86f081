import json, glob, statistics, collections
rows = collections.defaultdict(lambda: {0: [], 1: []})
for f in sorted(glob.glob('/work/bits/s50/ab/r*_v*/results.json')):
  v = int(f.split('_v')[1][0])
  for r in json.load(open(f))['results']:
    if r['kind'] == 'pipe' and 'plain' in r.get('paired', {}):
      rows[(r['model'], r['setting'])][v].append(r['step_time_s'] / r['paired']['plain']['step_time_s'])
print('| model | setting | over plain, before (median) | after | rounds before | rounds after |')
print('|---|---|---|---|---|---|')
for (m, s), d in rows.items():
  f = lambda xs: ', '.join(f'{x:.3f}' for x in xs)
  print(f'| {m} | {s} | {statistics.median(d[0]):.3f} | {statistics.median(d[1]) if d[1] else float("nan"):.3f} | {f(d[0])} | {f(d[1])} |')
