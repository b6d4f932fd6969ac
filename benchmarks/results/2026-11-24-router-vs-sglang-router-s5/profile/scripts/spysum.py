import sys, collections
self_c = collections.Counter(); incl = collections.Counter(); total = 0
for line in open(sys.argv[1]):
    line = line.rstrip()
    if not line: continue
    stack, n = line.rsplit(" ", 1); n = int(n); total += n
    frames = stack.split(";")
    self_c[frames[-1]] += n
    seen = set()
    for f in frames:
        key = f.split(" (")[0] + " (" + f.split(" (")[1].split(":")[0] if " (" in f else f
        if key not in seen:
            incl[key] += n; seen.add(key)
print("total samples", total)
print("--- self top 30")
for f, n in self_c.most_common(30): print(f"{100*n/total:5.1f}% {f}")
print("--- inclusive top 60")
for f, n in incl.most_common(int(sys.argv[2]) if len(sys.argv)>2 else 60): print(f"{100*n/total:5.1f}% {f}")
