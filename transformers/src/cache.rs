//! The fixed-capacity key/value cache of a decoder, and the attention masks read from it.
//!
//! Each layer holds `k` and `v` buffers of shape `[batch, kv_heads, slots, head_dim]`,
//! allocated once on that layer's device: `slots` is the capacity for full-attention layers
//! and the window for sliding layers whose window is shorter than the capacity. A sliding
//! layer's buffer is a ring: position `p` lives in slot `p % window`, so it holds the last
//! `window` keys, all a query can see (transformers' sliding-window cache layers keep as few).
//! A forward pass attends over the ring's earlier contents followed by its own keys, then
//! writes its last `window` keys into the ring.
//!
//! On eager devices a forward pass writes its keys and values in place and attends over the
//! slots filled so far. On compiled (PJRT) devices every shape must stay the same from one
//! decode step to the next, or each step would compile a new program: the write is a
//! `dynamic_update_slice` at a position tensor, attention spans every slot, and the mask
//! hides the slots not filled yet. Per row, the cache also remembers which positions hold
//! real tokens, so that left padding is masked out.
//!
//! A paged cache ([`KvCache::paged`]) holds every self-attention layer's keys
//! and values in one pool of fixed-size blocks, `[1, kv_heads, blocks * block_size,
//! head_dim]`, shared by the rows: each row's tokens lie in the blocks of its table (set by
//! the generation engine, which hands blocks out), position `p` at slot
//! `table[p / block_size] * block_size + p % block_size`. A block several rows start with (a
//! shared prompt prefix) is held once and read by all of them. Attention reads the pool up
//! to the highest block in use, every row's queries masked to the slots of its own table,
//! so padding, other rows' blocks and free blocks are never seen. On eager devices a pass
//! writes each row's runs of consecutive slots in place. On compiled devices it writes every
//! column in one `index_copy` to a slot tensor (padding to a spare block past the ones the
//! engine hands out, which no table holds), and attention reads a power of two of blocks (at
//! least 256 slots), so that the programs of a steady stream are a few buckets of rows,
//! widths and spans. A pass may also pack several sequences into one input row
//! ([`KvCache::set_packing`]): each column writes and reads its own sequence's blocks, so
//! sequences of different lengths share a pass without padding.

use zoo_runtime::{DType, Device, Tensor};

use crate::{Error, Result};

/// What the cache holds for one attention layer, and where.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CacheSpec {
    /// Self-attention over the tokens so far (with an optional window), or cross-attention
    /// to an encoder's output.
    pub attention: CacheAttention,
    /// Key/value heads of this layer.
    pub kv_heads: usize,
    /// Channels per head of this layer.
    pub head_dim: usize,
    /// The device of this layer's buffers (the layer's own).
    pub device: Device,
}

/// The kind of attention a cached layer runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CacheAttention {
    /// Causal self-attention; a sliding `window` sees only that many slots back.
    SelfAttention {
        /// `None` for full attention.
        window: Option<usize>,
    },
    /// Cross-attention: keys and values of the encoder's output, written once
    /// ([`KvCache::store_cross`]) and read every step.
    Cross,
}

impl CacheSpec {
    /// A causal self-attention layer (full when `window` is `None`).
    pub fn self_attention(
        kv_heads: usize,
        head_dim: usize,
        window: Option<usize>,
        device: Device,
    ) -> CacheSpec {
        CacheSpec {
            attention: CacheAttention::SelfAttention { window },
            kv_heads,
            head_dim,
            device,
        }
    }

    /// A cross-attention layer.
    pub fn cross(kv_heads: usize, head_dim: usize, device: Device) -> CacheSpec {
        CacheSpec {
            attention: CacheAttention::Cross,
            kv_heads,
            head_dim,
            device,
        }
    }
}

/// Keys and values of every layer for a batch of sequences.
///
/// Not `Clone`: on eager devices the buffers are written in place, so a copy that shared them
/// would see the other's writes.
#[derive(Debug)]
pub struct KvCache {
    /// Per layer: its spec and its buffers (self-attention: allocated at full capacity;
    /// cross-attention: `None` until [`KvCache::store_cross`]).
    layers: Vec<(CacheSpec, Option<(Tensor, Tensor)>)>,
    batch: usize,
    /// The first `rows` rows are the ones a forward pass runs (see [`KvCache::set_rows`]).
    rows: usize,
    capacity: usize,
    /// Slots filled so far (the same for every row: rows are left-padded to one length).
    len: usize,
    /// `valid[b][s]`: slot `s` of row `b` holds a real token (not padding).
    valid: Vec<Vec<bool>>,
    /// The device of each layer's buffers.
    devices: Vec<Device>,
    /// Write positions `[0, 0, slot, 0]` of this forward pass, uploaded once per device and
    /// slot, not once per layer.
    write_at: std::collections::HashMap<(Device, usize), Tensor>,
    /// Sliding layers hold only their window (see [`KvCache::from_specs_with`]).
    rings: bool,
    /// The block tables of a paged cache (see the module docs).
    paged: Option<Paged>,
    /// A compiled paged pass's write slots, uploaded once per device, not once per layer.
    pass_slots: std::collections::HashMap<Device, Tensor>,
}

/// The fewest slots a compiled paged pass attends over: the timeline's capacity bucket
/// ([`crate::generation::cache_bucket`]), so that a short generation compiles one decode
/// program.
const COMPILED_SPAN: usize = 256;

/// The rows of a paged cache: where each row's tokens lie, and this pass's writes.
#[derive(Debug)]
struct Paged {
    block_size: usize,
    /// Per row: its blocks, in token order.
    tables: Vec<Vec<u32>>,
    /// Per row: tokens written so far.
    lens: Vec<usize>,
    /// This pass, per input row and column: the slot, position and table (the row whose
    /// token it is) of a real token, `None` for padding.
    pass: Vec<Vec<Option<(usize, usize, usize)>>>,
    /// Packed passes ([`KvCache::set_packing`]): the table of each column of the one input
    /// row, `None` for padding.
    owners: Option<Vec<Option<usize>>>,
    /// Slots attention reads this pass: through the highest block of a running row (on
    /// compiled devices, rounded up to a power of two of blocks).
    span: usize,
    /// Blocks the engine hands out; a compiled pool has one more, where padding is written.
    blocks: usize,
    /// Whether the pool lies on compiled devices.
    compiled: bool,
}

impl Paged {
    /// The slot of row `b`'s position `p`.
    fn slot(&self, b: usize, p: usize) -> Option<usize> {
        let block = *self.tables[b].get(p / self.block_size)?;
        Some(block as usize * self.block_size + p % self.block_size)
    }

    /// This pass's write slot of every column of the first `rows` rows, in row order, on
    /// `device`: padding goes to the spare block past the engine's.
    fn slots(&self, rows: usize, device: &Device) -> Result<Tensor> {
        let spare = (self.blocks * self.block_size) as i64;
        let slots: Vec<i64> = self
            .pass
            .iter()
            .take(rows)
            .flatten()
            .map(|c| c.map_or(spare, |(s, _, _)| s as i64))
            .collect();
        let n = slots.len();
        Ok(Tensor::from_vec(slots, &[n], device)?)
    }
}

impl KvCache {
    /// An empty cache for `batch` rows of up to `capacity` tokens, one layer per spec, each
    /// with its own heads, head size and device; sliding layers as rings.
    pub fn from_specs(
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
    ) -> Result<KvCache> {
        KvCache::from_specs_with(specs, batch, capacity, dtype, true)
    }

    /// [`KvCache::from_specs`], with sliding layers as rings of their window only when
    /// `rings`. A ring holds the last `window` slots, which are a row's last `window` tokens
    /// only while its tokens are contiguous; rows that take their tokens at different steps
    /// (the generation engine's joins) leave padding between them and need full buffers.
    pub fn from_specs_with(
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
        rings: bool,
    ) -> Result<KvCache> {
        if batch == 0 || capacity == 0 {
            return Err(Error::invalid("cache", format!(
                "a KV cache needs at least one row and one slot (batch {batch}, capacity {capacity})"
            )));
        }
        KvCache::check_fits(specs, batch, capacity, dtype, rings)?;
        let layers = specs
            .iter()
            .map(|spec| {
                let slots = match spec.attention {
                    CacheAttention::SelfAttention { window } => {
                        ring(window, capacity, rings).unwrap_or(capacity)
                    }
                    CacheAttention::Cross => capacity,
                };
                let shape = [batch, spec.kv_heads, slots, spec.head_dim];
                let buffers = match spec.attention {
                    CacheAttention::SelfAttention { .. } => Some((
                        zeros_split_by_head(&shape, dtype, &spec.device)?,
                        zeros_split_by_head(&shape, dtype, &spec.device)?,
                    )),
                    CacheAttention::Cross => None,
                };
                Ok((spec.clone(), buffers))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(KvCache {
            layers,
            batch,
            rows: batch,
            capacity,
            len: 0,
            valid: vec![vec![false; capacity]; batch],
            devices: specs.iter().map(|s| s.device).collect(),
            write_at: std::collections::HashMap::new(),
            rings,
            paged: None,
            pass_slots: std::collections::HashMap::new(),
        })
    }

    /// An empty paged cache (see the module docs) for `rows` rows over a pool of `blocks`
    /// blocks of `block_size` slots, self-attention layers only, all on eager devices or all
    /// on compiled ones. Rows hold no blocks until [`KvCache::set_table`].
    pub fn paged(
        specs: &[CacheSpec],
        rows: usize,
        blocks: usize,
        block_size: usize,
        dtype: DType,
    ) -> Result<KvCache> {
        let eager = specs.iter().all(|s| s.device.is_eager());
        let compiled = specs.iter().all(|s| !s.device.is_eager());
        let causal = specs
            .iter()
            .all(|s| matches!(s.attention, CacheAttention::SelfAttention { .. }));
        if !(eager || compiled) || !causal {
            return Err(Error::Internal(
                "a paged cache holds self-attention layers, all on eager or all on compiled devices".into(),
            ));
        }
        let physical = blocks.checked_add(usize::from(compiled));
        let slots = physical
            .and_then(|b| b.checked_mul(block_size))
            .filter(|_| blocks > 0 && block_size > 0);
        let Some(slots) = slots.filter(|_| rows > 0) else {
            return Err(Error::invalid("cache", format!(
                "a paged KV cache needs at least one row and one slot ({rows} rows, {blocks} blocks of {block_size})"
            )));
        };
        let mut cache = KvCache::from_specs_with(specs, 1, slots, dtype, false)?;
        if compiled {
            // Pools held as buffers from the start: otherwise the first pass folds the zeros
            // into its program, which then differs from the same pass run later.
            let pools: Vec<&Tensor> = cache
                .layers
                .iter()
                .filter_map(|(_, x)| x.as_ref())
                .flat_map(|(k, v)| [k, v])
                .collect();
            Tensor::dispatch_all(&pools)?;
        }
        cache.batch = rows;
        cache.rows = rows;
        cache.valid = Vec::new();
        cache.paged = Some(Paged {
            block_size,
            tables: vec![Vec::new(); rows],
            lens: vec![0; rows],
            pass: Vec::new(),
            owners: None,
            span: 0,
            blocks,
            compiled,
        });
        Ok(cache)
    }

    /// Whether this cache is paged ([`KvCache::paged`]).
    pub fn is_paged(&self) -> bool {
        self.paged.is_some()
    }

    /// Sets row `b`'s blocks (in token order) and the tokens they hold so far, before a pass
    /// writes its next ones. Paged caches only.
    pub fn set_table(&mut self, b: usize, table: &[u32], len: usize) -> Result<()> {
        let Some(p) = self.paged.as_mut() else {
            return Err(Error::Internal(
                "block tables belong to a paged cache".into(),
            ));
        };
        let blocks = p.blocks;
        if b >= p.tables.len()
            || len > table.len() * p.block_size
            || table.iter().any(|&x| x as usize >= blocks)
        {
            return Err(Error::Internal(format!(
                "row {b}: a table of {} blocks holding {len} tokens in a pool of {blocks} blocks",
                table.len()
            )));
        }
        p.tables[b] = table.to_vec();
        p.lens[b] = len;
        Ok(())
    }

    /// Packs the next passes into one input row (vLLM's flattened batch): column `i` is a
    /// token of the sequence whose table is `owners[i]` (set with [`KvCache::set_table`]),
    /// `None` for padding, so that sequences of different lengths share a pass without
    /// padding each to the longest. `None` goes back to one input row per table. Paged
    /// caches only.
    pub fn set_packing(&mut self, owners: Option<Vec<Option<usize>>>) -> Result<()> {
        let Some(p) = self.paged.as_mut() else {
            return Err(Error::Internal("packing belongs to a paged cache".into()));
        };
        if let Some(bad) = owners
            .iter()
            .flatten()
            .flatten()
            .find(|&&b| b >= p.tables.len())
        {
            return Err(Error::Internal(format!(
                "a packed column of table {bad}, past the cache's {}",
                p.tables.len()
            )));
        }
        p.owners = owners;
        Ok(())
    }

    /// An empty cache of `layers` full self-attention layers of one shape on `device`.
    pub fn new(
        layers: usize,
        batch: usize,
        kv_heads: usize,
        capacity: usize,
        head_dim: usize,
        dtype: DType,
        device: &Device,
    ) -> Result<KvCache> {
        let spec = CacheSpec::self_attention(kv_heads, head_dim, None, *device);
        KvCache::from_specs(&vec![spec; layers], batch, capacity, dtype)
    }

    /// The spec of each layer.
    pub fn specs(&self) -> impl Iterator<Item = &CacheSpec> {
        self.layers.iter().map(|(s, _)| s)
    }

    /// The device of each layer's buffers.
    pub fn devices(&self) -> &[Device] {
        &self.devices
    }

    /// Rows in the batch.
    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Rows the next forward pass runs: the first `rows()` of the batch.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Runs the next forward passes over the first `n` rows only (1 to `batch`), so that a
    /// generation engine with free rows at the end computes nothing for them. The other rows
    /// keep their buffers and are not written. Eager devices or a paged cache (whose rows
    /// own no buffers) only: elsewhere a compiled program's shapes stay those of the whole
    /// batch.
    pub fn set_rows(&mut self, n: usize) -> Result<()> {
        let fixed = self.paged.is_none() && self.devices.iter().any(|d| !d.is_eager());
        if n == 0 || n > self.batch || (n < self.batch && fixed) {
            return Err(Error::Internal(format!(
                "a cache of {} rows cannot run {n} (fewer rows run on eager devices only)",
                self.batch
            )));
        }
        self.rows = n;
        Ok(())
    }

    /// Slots per row (of a paged cache: in the pool).
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Slots filled so far.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether nothing has been written yet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Forgets every token (the buffers are kept and overwritten).
    pub fn reset(&mut self) {
        self.len = 0;
        for row in &mut self.valid {
            row.fill(false);
        }
        if let Some(p) = self.paged.as_mut() {
            p.tables.iter_mut().for_each(Vec::clear);
            p.lens.fill(0);
        }
    }

    /// Forgets every token of row `b` (a sequence left it; the next one starts masked off
    /// from what it held).
    pub fn clear_row(&mut self, b: usize) {
        if let Some(row) = self.valid.get_mut(b) {
            row.fill(false);
        }
        if let Some(p) = self.paged.as_mut().filter(|p| b < p.tables.len()) {
            p.tables[b].clear();
            p.lens[b] = 0;
        }
    }

    /// Reserves `t` slots for the next forward pass, marking which hold real tokens
    /// (`token_mask[b][i]`, all true when `None`). Returns the first slot.
    pub fn begin(&mut self, t: usize, token_mask: Option<&[Vec<bool>]>) -> Result<usize> {
        if self.paged.is_some() {
            return self.begin_paged(t, token_mask);
        }
        if self.len + t > self.capacity {
            return Err(Error::invalid(
                "max_new_tokens",
                format!(
                    "the KV cache holds {} tokens; {} more do not fit (context used {}); \
                 ask for fewer new tokens or a shorter prompt",
                    self.capacity, t, self.len
                ),
            ));
        }
        if let Some(m) = token_mask {
            if m.len() != self.rows || m.iter().any(|r| r.len() != t) {
                return Err(Error::invalid(
                    "attention_mask",
                    format!(
                        "attention mask must be [{}, {t}] to match the input ids",
                        self.rows
                    ),
                ));
            }
        }
        let start = self.len;
        self.write_at.clear();
        for (b, row) in self.valid.iter_mut().enumerate().take(self.rows) {
            for i in 0..t {
                row[start + i] = token_mask.is_none_or(|m| m[b][i]);
            }
        }
        self.len += t;
        Ok(start)
    }

    /// [`KvCache::begin`] of a paged cache: each row's real tokens take its next positions,
    /// in slots its table already holds. Returns 0 (rows have no common start).
    fn begin_paged(&mut self, t: usize, token_mask: Option<&[Vec<bool>]>) -> Result<usize> {
        let rows = self.rows;
        let Some(p) = self.paged.as_mut() else {
            return Err(Error::Internal("not a paged cache".into()));
        };
        if token_mask.is_some_and(|m| m.len() != rows || m.iter().any(|r| r.len() != t)) {
            return Err(Error::invalid(
                "attention_mask",
                format!("attention mask must be [{rows}, {t}] to match the input ids"),
            ));
        }
        if p.owners.as_ref().is_some_and(|o| rows != 1 || o.len() != t) {
            return Err(Error::Internal(format!(
                "a packed pass of {} columns fed as [{rows}, {t}]",
                p.owners.as_ref().map_or(0, Vec::len)
            )));
        }
        self.write_at.clear();
        let mut pass = Vec::with_capacity(rows);
        for b in 0..rows {
            let mut cols = Vec::with_capacity(t);
            for i in 0..t {
                let owner = match &p.owners {
                    Some(o) => o[i],
                    None => Some(b),
                };
                let real = token_mask.is_none_or(|m| m[b][i]);
                let Some(owner) = owner.filter(|_| real) else {
                    cols.push(None);
                    continue;
                };
                let at = p.lens[owner];
                let Some(slot) = p.slot(owner, at) else {
                    return Err(Error::Internal(format!(
                        "row {owner} writes position {at}, past the {} blocks of its table",
                        p.tables[owner].len()
                    )));
                };
                cols.push(Some((slot, at, owner)));
                p.lens[owner] = at + 1;
            }
            pass.push(cols);
        }
        // Through the highest block of a table this pass reads.
        let read: Vec<usize> = match &p.owners {
            Some(o) => o.iter().flatten().copied().collect(),
            None => (0..rows).collect(),
        };
        let mut span = read
            .into_iter()
            .filter_map(|b| p.tables[b].iter().max().copied())
            .max()
            .map_or(0, |x| x as usize + 1);
        if p.compiled {
            let least = COMPILED_SPAN.div_ceil(p.block_size);
            span = span.max(least).next_power_of_two().min(p.blocks);
        }
        p.pass = pass;
        p.span = (span * p.block_size).max(1);
        self.pass_slots.clear();
        Ok(0)
    }

    /// Writes `k`, `v` (`[batch, kv_heads, t, head_dim]`) of `layer` at position `start` and
    /// returns the keys and values attention reads: every filled slot
    /// (`[batch, kv_heads, len, head_dim]`) for a full layer, the ring's earlier slots followed
    /// by `k`, `v` for a ring layer (see [`KvCache::attention_bias`] for the order).
    pub fn update(
        &mut self,
        layer: usize,
        k: &Tensor,
        v: &Tensor,
        start: usize,
    ) -> Result<(Tensor, Tensor)> {
        let (capacity, rows, batch) = (self.capacity, self.rows, self.batch);
        let Some((spec, Some((ck, cv)))) = self.layers.get_mut(layer) else {
            return Err(Error::invalid(
                "cache",
                format!(
                "the KV cache has no self-attention layer {layer}; it was built for another model"
            ),
            ));
        };
        let window = match spec.attention {
            CacheAttention::SelfAttention { window } => ring(window, capacity, self.rings),
            CacheAttention::Cross => None,
        };
        let k = k.to_dtype(ck.dtype())?.contiguous()?;
        let v = v.to_dtype(cv.dtype())?.contiguous()?;
        let device = ck.device();
        if let Some(p) = &self.paged {
            if device.is_eager() {
                return paged_update(p, rows, (&*ck, &*cv), (&k, &v));
            }
            let slots = match self.pass_slots.get(&device) {
                Some(s) => s.clone(),
                None => {
                    let s = p.slots(rows, &device)?;
                    self.pass_slots.insert(device, s.clone());
                    s
                }
            };
            return paged_index_copy(p, rows, (ck, cv), (&k, &v), &slots);
        }
        // The rows in use: a view of the first ones on eager devices (written in place).
        let (mut ck, mut cv) = match rows < batch {
            true => (ck.narrow(0, 0, rows)?, cv.narrow(0, 0, rows)?),
            false => (ck.clone(), cv.clone()),
        };
        let Some(w) = window else {
            let at = write_position(&mut self.write_at, &device, start)?;
            write(&mut ck, &k, start, at.as_ref())?;
            write(&mut cv, &v, start, at.as_ref())?;
            let out = if device.is_eager() {
                (ck.narrow(2, 0, self.len)?, cv.narrow(2, 0, self.len)?)
            } else {
                (ck.clone(), cv.clone())
            };
            self.store(layer, ck, cv);
            return Ok(out);
        };
        // Ring: what attention reads is copied out before the new keys overwrite slots.
        let t = k.dim(2)?;
        let past = if device.is_eager() { start.min(w) } else { w };
        let out = if past == 0 {
            (k.clone(), v.clone())
        } else {
            (
                Tensor::cat(&[&ck.narrow(2, 0, past)?, &k], 2)?,
                Tensor::cat(&[&cv.narrow(2, 0, past)?, &v], 2)?,
            )
        };
        // The last `w` keys of this pass go to their slots, in at most two runs.
        let n = t.min(w);
        let mut done = 0;
        while done < n {
            let pos = start + t - n + done;
            let slot = pos % w;
            let len = (w - slot).min(n - done);
            let at = write_position(&mut self.write_at, &device, slot)?;
            let from = t - n + done;
            write(
                &mut ck,
                &k.narrow(2, from, len)?.contiguous()?,
                slot,
                at.as_ref(),
            )?;
            write(
                &mut cv,
                &v.narrow(2, from, len)?.contiguous()?,
                slot,
                at.as_ref(),
            )?;
            done += len;
        }
        self.store(layer, ck, cv);
        Ok(out)
    }

    /// Keeps the buffers a compiled write produced (a new value for the whole batch); an
    /// eager write went in place, into the buffers themselves or a view of their rows.
    fn store(&mut self, layer: usize, k: Tensor, v: Tensor) {
        if self.rows < self.batch {
            return;
        }
        if let Some((_, Some((ck, cv)))) = self.layers.get_mut(layer) {
            if !ck.device().is_eager() {
                (*ck, *cv) = (k, v);
            }
        }
    }

    /// Stores the encoder's keys and values (`[batch, kv_heads, encoder_len, head_dim]`) of
    /// cross-attention `layer`, computed once per prompt.
    pub fn store_cross(&mut self, layer: usize, k: &Tensor, v: &Tensor) -> Result<()> {
        let batch = self.batch;
        let Some((spec, slot)) = self.layers.get_mut(layer) else {
            return Err(Error::invalid(
                "cache",
                format!("the KV cache has no layer {layer}; it was built for another model"),
            ));
        };
        if spec.attention != CacheAttention::Cross {
            return Err(Error::invalid(
                "cache",
                format!(
                    "layer {layer} of the KV cache is a self-attention layer, not cross-attention"
                ),
            ));
        }
        let want = [batch, spec.kv_heads, k.dim(2)?, spec.head_dim];
        if k.shape() != want || v.shape() != want {
            return Err(Error::Internal(format!(
                "cross-attention keys {:?} and values {:?} of layer {layer} must be {want:?}",
                k.shape(),
                v.shape()
            )));
        }
        *slot = Some((k.to_device(&spec.device)?, v.to_device(&spec.device)?));
        Ok(())
    }

    /// The encoder's keys and values of cross-attention `layer`, once stored.
    pub fn cross(&self, layer: usize) -> Option<(&Tensor, &Tensor)> {
        match self.layers.get(layer)? {
            (spec, Some((k, v))) if spec.attention == CacheAttention::Cross => Some((k, v)),
            _ => None,
        }
    }

    /// The slots attention reads on `device` in a full-attention layer: those filled so far
    /// on eager devices, the whole capacity on compiled ones (see the module docs).
    pub fn attended_len(&self, device: &Device) -> usize {
        if let Some(p) = &self.paged {
            p.span
        } else if device.is_eager() {
            self.len
        } else {
            self.capacity
        }
    }

    /// Additive attention bias `[batch, 1, t, keys]` on `device` for the `t` queries written
    /// at `start` in a layer with `window`: 0 where a query may see a key, the dtype's lowest
    /// finite value elsewhere (a finite value, as transformers uses, keeps fully masked padding
    /// rows free of NaN). A key is visible when it is a real token, not in the future, and,
    /// with a sliding `window`, fewer than `window` of the row's real tokens back (padding
    /// between them, as a join leaves, does not count). The keys are those
    /// [`KvCache::update`] returns: the [`KvCache::attended_len`] slots of a full layer; for a
    /// ring layer its slots (slot `j` holding the latest position before `start` that is `j`
    /// modulo the window) followed by this pass's `t` keys.
    pub fn attention_bias(
        &self,
        start: usize,
        t: usize,
        window: Option<usize>,
        dtype: DType,
        device: &Device,
    ) -> Result<Tensor> {
        if let Some(p) = &self.paged {
            return paged_bias(p, self.rows, t, window, dtype, device);
        }
        // The position each key holds, if any.
        let positions: Vec<Option<usize>> = match ring(window, self.capacity, self.rings) {
            None => (0..self.attended_len(device)).map(Some).collect(),
            Some(w) => {
                let past = if device.is_eager() { start.min(w) } else { w };
                (0..past)
                    .map(|j| {
                        let back = (start + w - 1 - j) % w;
                        (start > back).then(|| start - 1 - back)
                    })
                    .chain((start..start + t).map(Some))
                    .collect()
            }
        };
        let len = positions.len();
        let low = dtype.float_or_default().finite_min();
        let mut m = vec![0f64; self.rows * t * len];
        let mut before = vec![0usize; self.capacity + 1];
        for (b, row) in self.valid.iter().enumerate().take(self.rows) {
            // Real tokens before each slot: a window counts tokens, not slots, so padding
            // between a row's tokens (a join) does not narrow it.
            for (s, &v) in row.iter().enumerate() {
                before[s + 1] = before[s] + usize::from(v);
            }
            for i in 0..t {
                let q = start + i;
                let base = (b * t + i) * len;
                for (j, p) in positions.iter().enumerate() {
                    let near = |p: usize| window.is_none_or(|w| before[q] - before[p] < w);
                    let visible = p.is_some_and(|p| row[p] && p <= q && near(p));
                    if !visible {
                        m[base + j] = low;
                    }
                }
            }
        }
        Ok(Tensor::from_f64s(
            &m,
            &[self.rows, 1, t, len],
            dtype,
            device,
        )?)
    }
}

impl KvCache {
    /// Refuses a cache whose host-side buffers (every layer on an eager CPU device) would not
    /// fit the memory this process may still take, before any is allocated: a request for
    /// more tokens or sequences than memory holds is an error naming the sizes, not an
    /// aborted process.
    pub fn check_fits(
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
        rings: bool,
    ) -> Result<()> {
        let bytes = KvCache::host_bytes(specs, batch, capacity, dtype, rings);
        host_room_for(bytes).map_err(|(needs, has)| {
            let reason = format!(
                "a KV cache of {batch} sequence(s) × {capacity} tokens needs {needs} of host memory, \
                 and {has} is available; ask for fewer new tokens, a shorter prompt or fewer sequences"
            );
            Error::invalid("max_new_tokens", reason)
        })
    }

    /// [`KvCache::check_fits`] of a paged pool of `blocks` blocks of `block_size` slots,
    /// which the sequences share.
    pub fn check_pool_fits(
        specs: &[CacheSpec],
        blocks: usize,
        block_size: usize,
        dtype: DType,
    ) -> Result<()> {
        let slots = blocks.saturating_mul(block_size);
        let bytes = KvCache::host_bytes(specs, 1, slots, dtype, false);
        host_room_for(bytes).map_err(|(needs, has)| {
            let reason = format!(
                "a paged KV cache of {blocks} blocks of {block_size} tokens ({slots} tokens the \
                 sequences share) needs {needs} of host memory, and {has} is available; ask for \
                 fewer KV blocks, fewer sequences or a shorter context"
            );
            Error::invalid("kv_blocks", reason)
        })
    }

    /// The bytes of the buffers a cache of these specs keeps on the host (eager CPU layers);
    /// `None` past 2^64.
    pub fn host_bytes(
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
        rings: bool,
    ) -> Option<u64> {
        KvCache::bytes_on(&Device::Cpu, specs, batch, capacity, dtype, rings)
    }

    /// The bytes of the buffers a cache of these specs keeps on `device`; `None` past 2^64.
    pub fn bytes_on(
        device: &Device,
        specs: &[CacheSpec],
        batch: usize,
        capacity: usize,
        dtype: DType,
        rings: bool,
    ) -> Option<u64> {
        let per_slot = |spec: &CacheSpec| -> Option<u64> {
            let slots = match spec.attention {
                CacheAttention::SelfAttention { window } => {
                    ring(window, capacity, rings).unwrap_or(capacity)
                }
                CacheAttention::Cross => return Some(0),
            };
            (batch as u64)
                .checked_mul(2)?
                .checked_mul(spec.kv_heads as u64)?
                .checked_mul(slots as u64)?
                .checked_mul(spec.head_dim as u64)?
                .checked_mul(dtype.size_in_bytes() as u64)
        };
        specs
            .iter()
            .filter(|s| s.device == *device)
            .map(per_slot)
            .try_fold(0u64, |sum, b| sum.checked_add(b?))
    }
}

/// Whether `bytes` (`None`: past 2^64) fit the memory this process may still take; else
/// what they need and what is available, in words.
fn host_room_for(bytes: Option<u64>) -> std::result::Result<(), (String, String)> {
    let available = zoo_runtime::device_map::host_available();
    let fits = match (bytes, available) {
        (Some(b), Some(a)) => b <= a,
        (Some(_), None) => true,
        (None, _) => false,
    };
    if fits {
        return Ok(());
    }
    let needs = bytes.map_or(
        "more than 2^64 bytes".to_string(),
        zoo_runtime::device_map::human,
    );
    let has = available.map_or("unknown".to_string(), zoo_runtime::device_map::human);
    Err((needs, has))
}

/// [`KvCache::update`] of a paged cache: each row's real columns of `k`, `v` (`[rows,
/// kv_heads, t, head_dim]`) written to their slots in the pools `ck`, `cv` (`[1, kv_heads,
/// slots, head_dim]`), one write per run of consecutive slots; returns the pools through the
/// pass's span, the same for every row.
fn paged_update(
    p: &Paged,
    rows: usize,
    (ck, cv): (&Tensor, &Tensor),
    (k, v): (&Tensor, &Tensor),
) -> Result<(Tensor, Tensor)> {
    for (b, cols) in p.pass.iter().enumerate().take(rows) {
        let mut i = 0;
        while i < cols.len() {
            let Some((slot, _, _)) = cols[i] else {
                i += 1;
                continue;
            };
            let mut n = 1;
            while cols
                .get(i + n)
                .is_some_and(|c| c.is_some_and(|(s, _, _)| s == slot + n))
            {
                n += 1;
            }
            for (pool, x) in [(ck, k), (cv, v)] {
                let run = x.narrow(0, b, 1)?.narrow(2, i, n)?.contiguous()?;
                pool.write_slice_in_place(2, slot, &run)?;
            }
            i += n;
        }
    }
    Ok((paged_view(p, rows, ck)?, paged_view(p, rows, cv)?))
}

/// [`KvCache::update`] of a paged cache on a compiled device: `k`, `v` (`[rows, kv_heads, t,
/// head_dim]`) written column by column at `slots` (`[rows * t]`) of the pools `ck`, `cv`
/// in one `index_copy` each, which replaces them; returns the pools through the pass's span.
fn paged_index_copy(
    p: &Paged,
    rows: usize,
    (ck, cv): (&mut Tensor, &mut Tensor),
    (k, v): (&Tensor, &Tensor),
    slots: &Tensor,
) -> Result<(Tensor, Tensor)> {
    // `[rows, kv, t, d]` to the pool's `[1, kv, rows * t, d]`, columns in row order.
    let flat = |x: &Tensor| -> Result<Tensor> {
        let s = x.shape();
        let (kv, t, d) = (s[1], s[2], s[3]);
        let x = if rows == 1 {
            x.clone()
        } else {
            x.permute(&[1, 0, 2, 3])?
        };
        Ok(x.reshape_to(&[1, kv, rows * t, d])?)
    };
    *ck = ck.index_copy(2, slots, &flat(k)?)?;
    *cv = cv.index_copy(2, slots, &flat(v)?)?;
    Ok((paged_view(p, rows, ck)?, paged_view(p, rows, cv)?))
}

/// A zero cache buffer `[rows, kv_heads, slots, head_dim]`; on a mesh split by KV head
/// over its `model` axis when the heads divide (each device then holds the heads its share
/// of the attention computes), whole on every device otherwise.
fn zeros_split_by_head(shape: &[usize], dtype: DType, device: &Device) -> Result<Tensor> {
    let t = Tensor::zeros(shape, dtype, device)?;
    let mesh = match device {
        Device::Pjrt(d) => d.mesh(),
        _ => None,
    };
    match mesh.and_then(|m| zoo_runtime::device_map::split_if_divisible(&m, shape, 1)) {
        Some(s) => Ok(t.shard(&s)?),
        None => Ok(t),
    }
}

/// The pool `[1, kv_heads, slots, head_dim]` through the pass's span, as `rows` rows.
fn paged_view(p: &Paged, rows: usize, pool: &Tensor) -> Result<Tensor> {
    let x = pool.narrow(2, 0, p.span)?;
    Ok(match rows {
        1 => x,
        _ => {
            let mut shape = x.shape().to_vec();
            shape[0] = rows;
            x.broadcast_as(&shape)?
        }
    })
}

/// [`KvCache::attention_bias`] of a paged cache: `[rows, 1, t, span]`, a query seeing the
/// slots of its own sequence's positions up to its own (and, with a `window`, fewer than
/// `window` back).
fn paged_bias(
    p: &Paged,
    rows: usize,
    t: usize,
    window: Option<usize>,
    dtype: DType,
    device: &Device,
) -> Result<Tensor> {
    let span = p.span;
    let low = dtype.float_or_default().finite_min();
    let mut m = vec![low; rows * t * span];
    for (b, cols) in p.pass.iter().enumerate().take(rows) {
        for (i, col) in cols.iter().enumerate() {
            let Some((_, q, owner)) = *col else {
                continue;
            };
            let first = window.map_or(0, |w| (q + 1).saturating_sub(w));
            let base = (b * t + i) * span;
            for pos in first..=q {
                match p.slot(owner, pos) {
                    Some(s) if s < span => m[base + s] = 0.0,
                    _ => {
                        return Err(Error::Internal(format!(
                            "row {owner}'s position {pos} lies outside the pass's {span} slots"
                        )))
                    }
                }
            }
        }
    }
    Ok(Tensor::from_f64s(&m, &[rows, 1, t, span], dtype, device)?)
}

/// The ring size of a layer with `window` in a cache of `capacity`: the window when it is
/// shorter (a full-size buffer otherwise saves nothing) and the cache keeps `rings`.
fn ring(window: Option<usize>, capacity: usize, rings: bool) -> Option<usize> {
    window.filter(|&w| rings && w > 0 && w < capacity)
}

/// The device tensor `[0, 0, slot, 0]` for a compiled write at `slot`, shared by the layers
/// of one forward pass; `None` on eager devices (written in place).
fn write_position(
    cache: &mut std::collections::HashMap<(Device, usize), Tensor>,
    device: &Device,
    slot: usize,
) -> Result<Option<Tensor>> {
    if device.is_eager() {
        return Ok(None);
    }
    if let Some(at) = cache.get(&(*device, slot)) {
        return Ok(Some(at.clone()));
    }
    let at = Tensor::from_vec(vec![0i64, 0, slot as i64, 0], &[4], device)?;
    cache.insert((*device, slot), at.clone());
    Ok(Some(at))
}

/// Writes `x` into `buf` along dim 2 at `slot`: in place on eager devices, as a
/// `dynamic_update_slice` at `at` on compiled ones.
fn write(buf: &mut Tensor, x: &Tensor, slot: usize, at: Option<&Tensor>) -> Result<()> {
    match at {
        None => buf.write_slice_in_place(2, slot, x)?,
        Some(at) => *buf = buf.dynamic_update_slice(x, at)?,
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pass_over_the_first_rows_leaves_the_others_untouched() {
        let mut cache = KvCache::new(1, 3, 1, 4, 2, DType::F32, &Device::Cpu).unwrap();
        cache.set_rows(2).unwrap();
        assert_eq!(cache.rows(), 2);
        let start = cache.begin(1, None).unwrap();
        let k = Tensor::from_vec(vec![1f32, 2.0, 3.0, 4.0], &[2, 1, 1, 2], &Device::Cpu).unwrap();
        let (ks, _) = cache.update(0, &k, &k, start).unwrap();
        assert_eq!(ks.shape(), [2, 1, 1, 2]);
        let bias = cache
            .attention_bias(start, 1, None, DType::F32, &Device::Cpu)
            .unwrap();
        assert_eq!(bias.shape(), [2, 1, 1, 1]);
        // Back to every row: the first two hold the keys, the third was never written.
        cache.set_rows(3).unwrap();
        let start = cache.begin(1, None).unwrap();
        let zero = Tensor::zeros(&[3, 1, 1, 2], DType::F32, &Device::Cpu).unwrap();
        let (ks, _) = cache.update(0, &zero, &zero, start).unwrap();
        let first = ks.narrow(2, 0, 1).unwrap().contiguous().unwrap();
        assert_eq!(
            first.to_vec::<f32>().unwrap(),
            [1.0, 2.0, 3.0, 4.0, 0.0, 0.0]
        );
        assert!(cache.set_rows(0).is_err() && cache.set_rows(4).is_err());
    }

    #[test]
    fn layers_follow_their_specs() {
        let specs = [
            CacheSpec::self_attention(2, 8, None, Device::Cpu),
            CacheSpec::self_attention(1, 16, Some(4), Device::Cpu),
            CacheSpec::cross(2, 8, Device::Cpu),
        ];
        let mut cache = KvCache::from_specs(&specs, 1, 6, DType::F32).unwrap();
        assert_eq!(cache.specs().cloned().collect::<Vec<_>>(), specs);
        let start = cache.begin(3, None).unwrap();
        let k = Tensor::ones(&[1, 1, 3, 16], DType::F32, &Device::Cpu).unwrap();
        let (ck, _) = cache.update(1, &k, &k, start).unwrap();
        assert_eq!(ck.shape(), [1, 1, 3, 16]);
        // A layer's own shape is enforced by its buffers; a cross layer takes no update.
        assert!(cache.update(0, &k, &k, start).is_err());
        assert!(cache.update(2, &k, &k, start).is_err());
        assert!(cache.cross(2).is_none());
        let enc = Tensor::ones(&[1, 2, 5, 8], DType::F32, &Device::Cpu).unwrap();
        cache.store_cross(2, &enc, &enc).unwrap();
        assert_eq!(cache.cross(2).unwrap().0.shape(), [1, 2, 5, 8]);
        assert!(cache.store_cross(0, &enc, &enc).is_err());
        let wrong = Tensor::ones(&[1, 1, 5, 8], DType::F32, &Device::Cpu).unwrap();
        assert!(cache.store_cross(2, &wrong, &wrong).is_err());
    }

    /// A paged cache: two rows whose tables share their first block (a common prefix,
    /// written once by row 0) and hold the rest in blocks out of order attend, through the
    /// pool, exactly as each row alone over its own keys; padding takes no slot, and a
    /// window counts positions.
    #[test]
    fn paged_rows_attend_over_their_own_blocks() {
        let dev = Device::Cpu;
        let (bs, d) = (2, 3);
        let specs = [CacheSpec::self_attention(1, d, None, dev)];
        let mut paged = KvCache::paged(&specs, 2, 5, bs, DType::F32).unwrap();
        let value = |r: usize, p: usize, j: usize| ((r * 31 + p * 7 + j * 3) % 11) as f32 - 5.0;
        // Row 0 writes positions 0..3 (block 4 then 1); row 1 shares block 4 (positions 0, 1
        // hold the same keys) and writes 2..5 into blocks 0 and 3, one column padded.
        let shared = |r: usize, p: usize| if p < 2 { 0 } else { r };
        paged.set_table(0, &[4, 1], 0).unwrap();
        paged.set_table(1, &[4, 0, 3], 2).unwrap();
        let mask = vec![vec![true, true, true, false], vec![false, true, true, true]];
        let start = paged.begin(4, Some(&mask)).unwrap();
        assert_eq!(start, 0);
        let mut k = vec![0f32; 2 * 4 * d];
        for r in 0..2 {
            let first = if r == 0 { 0 } else { 2 };
            let real: Vec<usize> = (0..4).filter(|&i| mask[r][i]).collect();
            for (n, &i) in real.iter().enumerate() {
                for j in 0..d {
                    k[(r * 4 + i) * d + j] = value(shared(r, first + n), first + n, j);
                }
            }
        }
        let k = Tensor::from_vec(k, &[2, 1, 4, d], &dev).unwrap();
        let (ks, vs) = paged.update(0, &k, &k, start).unwrap();
        assert_eq!(ks.shape(), [2, 1, 10, d]);
        let q = Tensor::from_vec(
            (0..2 * 4 * d).map(|i| (i % 5) as f32 * 0.3 - 0.6).collect(),
            &[2, 1, 4, d],
            &dev,
        )
        .unwrap();
        for window in [None, Some(2)] {
            let bias = paged
                .attention_bias(start, 4, window, DType::F32, &dev)
                .unwrap();
            let opts = zoo_runtime::SdpaOptions {
                mask: Some(&bias),
                ..Default::default()
            };
            let got = Tensor::scaled_dot_product_attention(&q, &ks, &vs, &opts).unwrap();
            // Each row alone: its keys in position order, the query at column i seeing
            // positions up to its own.
            for (r, row_mask) in mask.iter().enumerate() {
                let len = if r == 0 { 3 } else { 5 };
                let keys: Vec<f32> = (0..len)
                    .flat_map(|p| (0..d).map(move |j| value(shared(r, p), p, j)))
                    .collect();
                let keys = Tensor::from_vec(keys, &[1, 1, len, d], &dev).unwrap();
                let first = if r == 0 { 0 } else { 2 };
                let real: Vec<usize> = (0..4).filter(|&i| row_mask[i]).collect();
                for (n, &i) in real.iter().enumerate() {
                    let pos = first + n;
                    let m: Vec<f64> = (0..len)
                        .map(|p| {
                            let seen = p <= pos && window.is_none_or(|w| pos - p < w);
                            if seen {
                                0.0
                            } else {
                                f32::MIN as f64
                            }
                        })
                        .collect();
                    let m = Tensor::from_f64s(&m, &[1, 1, 1, len], DType::F32, &dev).unwrap();
                    let qi = q.narrow(0, r, 1).unwrap().narrow(2, i, 1).unwrap();
                    let opts = zoo_runtime::SdpaOptions {
                        mask: Some(&m),
                        ..Default::default()
                    };
                    let want = Tensor::scaled_dot_product_attention(&qi, &keys, &keys, &opts)
                        .unwrap()
                        .to_vec::<f32>()
                        .unwrap();
                    let row = got.narrow(0, r, 1).unwrap().narrow(2, i, 1).unwrap();
                    let row = row.contiguous().unwrap().to_vec::<f32>().unwrap();
                    for (a, b) in row.iter().zip(&want) {
                        assert!(
                            (a - b).abs() < 1e-6,
                            "row {r} column {i} {window:?}: {row:?} vs {want:?}"
                        );
                    }
                }
            }
        }
        // A position past a row's table is an error, not a write elsewhere.
        paged.set_table(0, &[4], 2).unwrap();
        assert!(paged.begin(1, None).is_err());
        assert!(
            paged.set_table(0, &[5], 0).is_err(),
            "block 5 is past the pool"
        );
    }

    /// Attention through a window-3 ring equals attention over every key so far with the
    /// sliding mask, for a prefill longer than the window, one shorter, and decode steps past
    /// the wrap, with a left-padded row.
    #[test]
    fn a_ring_attends_like_all_keys_with_a_sliding_mask() {
        let dev = Device::Cpu;
        let (w, cap) = (3, 12);
        let ring = [CacheSpec::self_attention(1, 2, Some(w), dev)];
        let mut b = KvCache::from_specs(&ring, 2, cap, DType::F32).unwrap();
        let mut seed = 1u64;
        let mut rand = |shape: &[usize]| {
            let n: usize = shape.iter().product();
            let v: Vec<f32> = (0..n)
                .map(|_| {
                    seed = seed
                        .wrapping_mul(6364136223846793005)
                        .wrapping_add(1442695040888963407);
                    (seed >> 40) as f32 / (1u64 << 24) as f32 - 0.5
                })
                .collect();
            Tensor::from_vec(v, shape, &dev).unwrap()
        };
        let (mut all_k, mut all_v): (Option<Tensor>, Option<Tensor>) = (None, None);
        let mut real: Vec<Vec<bool>> = vec![Vec::new(), Vec::new()];
        let sdpa = |q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor| {
            let opts = zoo_runtime::SdpaOptions {
                mask: Some(bias),
                ..Default::default()
            };
            Tensor::scaled_dot_product_attention(q, k, v, &opts)
                .unwrap()
                .to_vec::<f32>()
                .unwrap()
        };
        for (pass, t) in [5usize, 2, 1, 1, 1].into_iter().enumerate() {
            let mask = (pass == 0).then(|| vec![vec![true; t], (0..t).map(|i| i >= 2).collect()]);
            let (q, k, v) = (
                rand(&[2, 1, t, 2]),
                rand(&[2, 1, t, 2]),
                rand(&[2, 1, t, 2]),
            );
            let start = b.begin(t, mask.as_deref()).unwrap();
            let (ks, vs) = b.update(0, &k, &v, start).unwrap();
            let bias = b
                .attention_bias(start, t, Some(w), DType::F32, &dev)
                .unwrap();
            let got = sdpa(&q, &ks, &vs, &bias);
            // The reference: every key so far, masked by position.
            let cat = |all: &mut Option<Tensor>, x: &Tensor| {
                *all = Some(match all.take() {
                    None => x.clone(),
                    Some(a) => Tensor::cat(&[&a, x], 2).unwrap(),
                });
            };
            cat(&mut all_k, &k);
            cat(&mut all_v, &v);
            for (r, row) in real.iter_mut().enumerate() {
                row.extend((0..t).map(|i| mask.as_ref().is_none_or(|m| m[r][i])));
            }
            let len = start + t;
            let mut m = vec![0f64; 2 * t * len];
            for (r, row) in real.iter().enumerate() {
                for i in 0..t {
                    let q = start + i;
                    for (p, &ok) in row.iter().enumerate() {
                        if !(ok && p <= q && q - p < w) {
                            m[(r * t + i) * len + p] = f32::MIN as f64;
                        }
                    }
                }
            }
            let bias = Tensor::from_f64s(&m, &[2, 1, t, len], DType::F32, &dev).unwrap();
            let want = sdpa(&q, all_k.as_ref().unwrap(), all_v.as_ref().unwrap(), &bias);
            let diff = got
                .iter()
                .zip(&want)
                .map(|(x, y)| (x - y).abs())
                .fold(0f32, f32::max);
            assert!(
                diff < 1e-6,
                "pass {pass}: ring and all keys differ by {diff}"
            );
        }
        // The ring holds the window, not the capacity.
        let (k, _) = b.layers[0].1.as_ref().unwrap();
        assert_eq!(k.shape(), [2, 1, w, 2]);
    }
}
