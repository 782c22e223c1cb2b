# A line-by-line numpy emulation of shaders/matmul_coopmat.comp (tiles, shared-memory layout and
# alignment, transposes, batching, grid-stride loops, blocks dealt to subgroups in rounds, guards),
# with the cooperative-matrix load / multiply-add / store emulated, against a float64 product of the
# fp16-rounded inputs. For checking the shader's index logic on a machine that cannot run it:
#   /usr/bin/python3 backends/vulkan/coopmat_emul.py   -> "all ok" (~10 s)
# Keep it in step with the shader when either changes.
import numpy as np, itertools, random
def run(M,N,K,TA,TB,batch,MM,MN,MK,nsub,gy,gz,offs):
    BM,BN,BK=4*MM,4*MN,2*MK; SM=SN=2; WG=128
    BLK_N=BN//(SN*MN); NBLK=(BM//(SM*MM))*BLK_N
    LDA,LDB,LDC=BK+8,BN+8,BN+4
    rng=np.random.default_rng(M*7+N*3+K)
    lda = M if TA else K; ldb = K if TB else N
    Asz=batch*M*K; Bsz=batch*K*N; Csz=batch*M*N
    A=np.zeros(offs[1]+Asz,np.float32); B=np.zeros(offs[2]+Bsz,np.float32); C=np.full(offs[0]+Csz,np.nan,np.float32)
    A[offs[1]:]=rng.uniform(-1,1,Asz); B[offs[2]:]=rng.uniform(-1,1,Bsz)
    p=[M,N,K,lda,ldb,N,M*K,K*N,M*N,batch]
    gx=(N+BN-1)//BN
    for wx,wy,wz in itertools.product(range(gx),range(gy),range(gz)):
        As=np.full(BM*LDA,np.nan,np.float16); Bs=np.full(BK*LDB,np.nan,np.float16); Cs=np.full(BM*LDC,np.nan,np.float32)
        n0=wx*BN; rounds=(NBLK+nsub-1)//nsub
        for bz in range(wz,p[9],gz):
            for m0 in range(wy*BM,M,gy*BM):
                abase=offs[1]+bz*p[6]; bbase=offs[2]+bz*p[7]; cbase=offs[0]+bz*p[8]
                accs={}
                for r in range(rounds):
                    for sg in range(nsub):
                        accs[(r,sg)]=[[np.zeros((MM,MN),np.float32) for j in range(SN)] for i in range(SM)]
                    for k0 in range(0,K,BK):
                        for i in range(BM*BK):
                            if TA: kk,mm=i//BM,i%BM
                            else: mm,kk=i//BK,i%BK
                            m,k=m0+mm,k0+kk; v=0.0
                            if m<M and k<K: v=A[abase+k*lda+m] if TA else A[abase+m*lda+k]
                            As[mm*LDA+kk]=np.float16(v)
                        for i in range(BK*BN):
                            if TB: nn,kk=i//BK,i%BK
                            else: kk,nn=i//BN,i%BN
                            n,k=n0+nn,k0+kk; v=0.0
                            if n<N and k<K: v=B[bbase+n*ldb+k] if TB else B[bbase+k*ldb+n]
                            Bs[kk*LDB+nn]=np.float16(v)
                        for sg in range(nsub):
                            blk=r*nsub+sg
                            if blk>=NBLK: continue
                            bm=(blk//BLK_N)*(SM*MM); bn=(blk%BLK_N)*(SN*MN)
                            acc=accs[(r,sg)]
                            for kk in range(0,BK,MK):
                                def load(arr,off,ld,R,Cc):
                                    assert off%8==0 and ld%8==0
                                    return np.array([[arr[off+rr*ld+cc] for cc in range(Cc)] for rr in range(R)],np.float32)
                                a=[load(As,(bm+i*MM)*LDA+kk,LDA,MM,MK) for i in range(SM)]
                                b=[load(Bs,kk*LDB+bn+j*MN,LDB,MK,MN) for j in range(SN)]
                                assert not any(np.isnan(x).any() for x in a+b)
                                for i in range(SM):
                                    for j in range(SN): acc[i][j]=(a[i].astype(np.float64)@b[j].astype(np.float64)+acc[i][j]).astype(np.float32)
                    for sg in range(nsub):
                        blk=r*nsub+sg
                        if blk>=NBLK: continue
                        bm=(blk//BLK_N)*(SM*MM); bn=(blk%BLK_N)*(SN*MN)
                        for i in range(SM):
                            for j in range(SN):
                                off=(bm+i*MM)*LDC+bn+j*MN; assert off%4==0
                                for rr in range(MM): Cs[off+rr*LDC:off+rr*LDC+MN]=accs[(r,sg)][i][j][rr]
                for i in range(BM*BN):
                    mm,nn=i//BN,i%BN; m,n=m0+mm,n0+nn
                    if m<M and n<N:
                        assert not np.isnan(Cs[mm*LDC+nn]); C[cbase+m*p[5]+n]=Cs[mm*LDC+nn]
    # reference with fp16-rounded inputs
    err=0
    for bz in range(batch):
        a=A[offs[1]+bz*M*K:offs[1]+(bz+1)*M*K].astype(np.float16).astype(np.float64)
        b=B[offs[2]+bz*K*N:offs[2]+(bz+1)*K*N].astype(np.float16).astype(np.float64)
        a=a.reshape(K,M).T if TA else a.reshape(M,K); b=b.reshape(N,K).T if TB else b.reshape(K,N)
        ref=a@b; got=C[offs[0]+bz*M*N:offs[0]+(bz+1)*M*N].reshape(M,N).astype(np.float64)
        err=max(err,np.abs(got-ref).max() if M*N else 0)
    assert not np.isnan(C[offs[0]:]).any(), "unwritten output"
    return err
cases=[(1,1,1),(5,7,3),(17,33,40),(64,64,32),(70,130,65),(16,16,16),(3,100,1)]
for (M,N,K),TA,TB in itertools.product(cases,[0,1],[0,1]):
    for MM,MN,MK,nsub,gy,gz,batch in [(16,16,16,4,2,1,1),(16,8,16,2,1,2,3),(8,8,8,8,1,1,2),(16,16,8,3,1,1,1)]:
        offs=[random.randint(0,5) for _ in range(3)]
        e=run(M,N,K,TA,TB,batch,MM,MN,MK,nsub,gy,gz,offs)
        assert e<1e-4*max(1,K), (M,N,K,TA,TB,MM,MN,MK,nsub,e)
print("all ok")
