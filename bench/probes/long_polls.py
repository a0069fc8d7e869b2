import asyncio, json, subprocess, sys, time, re, os, tempfile, statistics, urllib.request
binary=sys.argv[1]; N=int(sys.argv[2]); extra=sys.argv[3] if len(sys.argv)>3 else ""; backend=sys.argv[4] if len(sys.argv)>4 else "sqlite"
d=tempfile.mkdtemp()
A="acme-key-0123456789abcdef"; B="beta-key-0123456789abcdef"
db = f"sqlite://{d}/t.db"
if backend=="postgres":
    schema="probe_"+str(os.getpid())
    subprocess.run(["psql","postgres://postgres@127.0.0.1:5432/test","-qc",f'CREATE SCHEMA "{schema}"'],check=True)
    db=f"postgres://postgres@127.0.0.1:5432/test?options=-c%20search_path%3D{schema}"
cfg=os.path.join(d,"t.toml")
open(cfg,"w").write(f'''[server]
max_wait="60s"
[database]
url="{db}"
[models.default]
provider="dev"
model="dev-1"
[models.slow]
provider="dev"
model="dev-1"
params={{latency_ms=600000}}
[apps.acme]
api_keys=["{A}"]
[apps.beta]
api_keys=["{B}"]
{extra}
''')
p=subprocess.Popen([binary,"serve","--addr","127.0.0.1:0","--config",cfg],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL,text=True,cwd=d)
for line in p.stdout:
    if line.startswith("Tollgate listening on "): base=line.split()[-1]; break
host,port=base[7:].split(":")
def call(method,path,key,body=None):
    req=urllib.request.Request(base+path,method=method,data=json.dumps(body).encode() if body else None,headers={"Authorization":"Bearer "+key,"Content-Type":"application/json"})
    try:
        r=urllib.request.urlopen(req,timeout=60); return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e: return e.code, json.loads(e.read())
st,t=call("POST","/v1/tasks",A,{"kind":"classify","scope":"s","model":"slow","effect_key":"k1","request":{"input":"x","labels":["a","b"]}})
st,bt=call("POST","/v1/tasks",B,{"kind":"classify","scope":"s","model":"slow","effect_key":"k2","request":{"input":"x","labels":["a","b"]}})
tid=t["id"]; bid=bt["id"]
def rss():
    s=open(f"/proc/{p.pid}/status").read(); return int(re.search(r"VmRSS:\s+(\d+)",s).group(1))//1024
async def waiter(i, results):
    try:
        r,w=await asyncio.open_connection(host,int(port))
        w.write(f"GET /v1/tasks/{tid}?wait=60s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {A}\r\n\r\n".encode()); await w.drain()
        line=await asyncio.wait_for(r.readline(), 90)
        results.append(line.split()[1].decode() if line else "closed")
        w.close()
    except Exception as e:
        results.append(type(e).__name__)
async def main():
    results=[]
    tasks=[asyncio.create_task(waiter(i,results)) for i in range(N)]
    await asyncio.sleep(8)
    lat=[]
    loop=asyncio.get_running_loop()
    for _ in range(40):
        t0=time.time(); st,_=await loop.run_in_executor(None, call,"GET",f"/v1/tasks/{bid}",B); lat.append((time.time()-t0)*1000)
        assert st==200, st
    m=rss()
    early={}
    for x in results: early[x]=early.get(x,0)+1
    print(f"{N} acme waiters: beta probe median {statistics.median(lat):.1f} ms p90 {sorted(lat)[int(len(lat)*0.9)]:.1f} ms; RSS {m} MB; answered early: {early}")
    for t in tasks: t.cancel()
asyncio.run(main())
p.kill()
if backend=="postgres":
    subprocess.run(["psql","postgres://postgres@127.0.0.1:5432/test","-qc",f'DROP SCHEMA "{schema}" CASCADE'])
