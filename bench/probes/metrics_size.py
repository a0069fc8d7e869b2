import json, subprocess, sys, time, re, os, tempfile, urllib.request
binary=sys.argv[1]; N=int(sys.argv[2])
d=tempfile.mkdtemp(); cfg=os.path.join(d,"t.toml")
open(cfg,"w").write(f'[database]\nurl="sqlite://{d}/t.db"\n[workers]\nconcurrency=8\n')
p=subprocess.Popen([binary,"serve","--addr","127.0.0.1:0","--config",cfg],stdout=subprocess.PIPE,stderr=subprocess.DEVNULL,text=True,cwd=d)
for line in p.stdout:
    if line.startswith("Tollgate listening on "): base=line.split()[-1]
    m=re.search(r"API key: (\S+)",line)
    if m: key=m.group(1); break
def call(method,path,body=None,auth=True):
    req=urllib.request.Request(base+path,method=method,data=json.dumps(body).encode() if body else None,headers={"Authorization":"Bearer "+key,"Content-Type":"application/json"})
    r=urllib.request.urlopen(req,timeout=120); return r.read()
def scrape():
    t=time.time(); b=call("GET","/metrics"); return len(b), (time.time()-t)*1000, b
s0,_,_=scrape()
done=0
for start in range(0,N,1000):
    items=[{"kind":"classify","scope":f"customer-{i}","effect_key":f"k{i}","request":{"input":"x","labels":["a","b"]}} for i in range(start,min(N,start+1000))]
    call("POST","/v1/tasks/batch",{"tasks":items})
deadline=time.time()+300
while time.time()<deadline:
    st=json.loads(call("GET","/v1/stats"))
    if "customer-" in scrape()[2].decode() and False: pass
    txt=json.dumps(st)
    m=re.search(r'"succeeded":\s*(\d+)',txt)
    if m and int(m.group(1))>=N: break
    time.sleep(1)
size,ms,body=scrape()
print(f"{N} scopes: /metrics {size} bytes ({ms:.0f} ms) vs {s0} bytes at start; names a scope: {b'customer-' in body}; names the app: {b'app=' in body}")
p.kill()
