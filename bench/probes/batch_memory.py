import json, subprocess, sys, time, re, os, urllib.request, tempfile, threading
binary = sys.argv[1]; item_count=int(sys.argv[2]); per=int(sys.argv[3]); conc=int(sys.argv[4]) if len(sys.argv)>4 else 1
extra = sys.argv[5] if len(sys.argv)>5 else ""
d = tempfile.mkdtemp()
cfg = os.path.join(d, "t.toml")
open(cfg,"w").write(f'[server]\nmax_wait="5s"\n{extra}\n[database]\nurl="sqlite://{d}/t.db"\n[workers]\nconcurrency=0\n')
p = subprocess.Popen([binary, "serve", "--addr", "127.0.0.1:0", "--config", cfg], stdout=subprocess.PIPE, text=True, cwd=d)
base=key=None
for line in p.stdout:
    if line.startswith("Tollgate listening on "): base=line.split()[-1]
    m = re.search(r"API key: (\S+)", line)
    if m: key=m.group(1); break
def status():
    s=open(f"/proc/{p.pid}/status").read()
    g=lambda k: int(re.search(k+r":\s+(\d+)", s).group(1))//1024
    return g("VmRSS"), g("VmHWM")
def body(tag):
    tasks=[]
    for i in range(item_count):
        items=[{"id": f"i{j}", "input": ("lorem ipsum dolor sit amet %d %d " % (i,j))*12} for j in range(per)]
        tasks.append({"kind":"classify_many","scope":f"s{i%10}","effect_key":f"{tag}-{i}","request":{"items":items,"labels":["a","b"]}})
    return json.dumps({"tasks":tasks}).encode()
def post(b, out):
    req=urllib.request.Request(base+"/v1/tasks/batch", data=b, headers={"Authorization":"Bearer "+key,"Content-Type":"application/json"})
    try:
        r=urllib.request.urlopen(req, timeout=600); out.append((r.status, len(r.read())))
    except urllib.error.HTTPError as e:
        out.append((e.code, e.read()[:200]))
time.sleep(1)
# warm-up small request
post(json.dumps({"tasks":[]}).encode(), [])
r0,h0=status()
bodies=[body(f"b{k}") for k in range(conc)]
print("body MB", round(len(bodies[0])/1e6,1), "x", conc)
r0,h0=status()
print("before: RSS", r0, "MB HWM", h0, "MB")
outs=[]; ts=[threading.Thread(target=post,args=(b,outs)) for b in bodies]
t=time.time()
[x.start() for x in ts]; [x.join() for x in ts]
print("answers", [(o[0], o[1] if isinstance(o[1],int) else o[1]) for o in outs], "in", round(time.time()-t,1),"s")
r1,h1=status()
time.sleep(2)
r2,h2=status()
print("after: RSS", r1, "MB, 2 s later", r2, "MB; HWM", h2, "MB; peak growth", h2-h0, "MB")
p.kill()
