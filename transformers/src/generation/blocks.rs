//! The block pool of a paged KV cache: which fixed-size blocks of slots are free, which hold
//! a running sequence's tokens (counted references: a cached prefix is shared by every
//! sequence that starts with it), and which full blocks of tokens stay cached after their
//! sequences left, found again by a hash chain and evicted least recently used first.
//!
//! A full block is keyed as vLLM's prefix cache keys it: the hash of its parent block's key
//! and its own tokens, so a key names the whole prefix up to that block. A hit is checked
//! against the stored parent and tokens, so a hash collision cannot hand a sequence another
//! prompt's keys and values.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};

/// A block's id: its slots are `id * block_size ..` in every layer's pool.
pub(crate) type BlockId = u32;

/// What a cached block holds: its parent's key (none for a first block) and its tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Key {
    parent: Option<u64>,
    tokens: Vec<u32>,
}

/// The key of a full block following `parent` (see the module docs).
pub(crate) fn chain_hash(parent: Option<u64>, tokens: &[u32]) -> u64 {
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

/// Free, referenced and cached blocks (see the module docs).
#[derive(Debug)]
pub(crate) struct BlockPool {
    block_size: usize,
    /// References per block: the sequences whose tables hold it.
    refs: Vec<u32>,
    /// Blocks that hold nothing worth keeping, lowest first, so that the slots in use stay
    /// packed at the start of the pool (attention spans up to the highest one in use).
    free: BTreeSet<BlockId>,
    /// Cached blocks no sequence holds, by the tick they were released (oldest first).
    evictable: BTreeMap<u64, BlockId>,
    /// The release tick of each evictable block.
    released_at: HashMap<BlockId, u64>,
    /// Full blocks by key, and each cached block's key and contents.
    cached: HashMap<u64, BlockId>,
    keys: HashMap<BlockId, (u64, Key)>,
    tick: u64,
}

impl BlockPool {
    /// A pool of `blocks` blocks of `block_size` slots, all free.
    pub(crate) fn new(blocks: usize, block_size: usize) -> BlockPool {
        BlockPool {
            block_size,
            refs: vec![0; blocks],
            free: (0..blocks as BlockId).collect(),
            evictable: BTreeMap::new(),
            released_at: HashMap::new(),
            cached: HashMap::new(),
            keys: HashMap::new(),
            tick: 0,
        }
    }

    /// Blocks in the pool.
    pub(crate) fn total(&self) -> usize {
        self.refs.len()
    }

    /// Blocks some sequence holds.
    pub(crate) fn used(&self) -> usize {
        self.refs.iter().filter(|&&r| r > 0).count()
    }

    /// Blocks an allocation may take: the free ones and the cached ones nothing holds.
    pub(crate) fn available(&self) -> usize {
        self.free.len() + self.evictable.len()
    }

    /// Blocks `tokens` slots take.
    pub(crate) fn blocks_for(&self, tokens: usize) -> usize {
        tokens.div_ceil(self.block_size)
    }

    /// A block for one sequence. Attention reads the pool up to the highest block held, so
    /// the blocks in use are kept low: a free block inside that span first; else, while
    /// cached blocks lie below the lowest free one, the least recently used of them
    /// (forgotten by the cache); else the lowest free block. The prefix cache thus keeps
    /// what fits below the highest block the sequences have needed at once, least recently
    /// used first out. `None` when every block is held.
    pub(crate) fn allocate(&mut self) -> Option<BlockId> {
        let held = self.refs.iter().rposition(|&r| r > 0).map_or(0, |b| b + 1);
        let lowest_free = self.free.first().copied();
        let inside = lowest_free.filter(|&b| (b as usize) < held);
        let evict = match (inside, lowest_free) {
            (Some(_), _) => None,
            (None, Some(f)) => self.evictable.iter().find(|(_, &b)| b < f).map(|(&t, _)| t),
            (None, None) => self.evictable.keys().next().copied(),
        };
        let block = match evict {
            Some(tick) => {
                let b = self.evictable.remove(&tick)?;
                self.released_at.remove(&b);
                if let Some((hash, _)) = self.keys.remove(&b) {
                    self.cached.remove(&hash);
                }
                b
            }
            None => self.free.pop_first()?,
        };
        self.refs[block as usize] = 1;
        Some(block)
    }

    /// Drops one sequence's reference to `block`: a block nothing holds stays cached (to be
    /// evicted last-used-first) when it has a key, and is free otherwise.
    pub(crate) fn release(&mut self, block: BlockId) {
        let r = &mut self.refs[block as usize];
        *r = r.saturating_sub(1);
        if *r > 0 {
            return;
        }
        if self.keys.contains_key(&block) {
            self.tick += 1;
            self.evictable.insert(self.tick, block);
            self.released_at.insert(block, self.tick);
        } else {
            self.free.insert(block);
        }
    }

    /// Records that `block` holds the full block `tokens` after the block keyed `parent`,
    /// returning its key. A block already cached under that key keeps it (the same keys and
    /// values computed twice); this one stays unkeyed and is freed on release.
    pub(crate) fn register(&mut self, block: BlockId, parent: Option<u64>, tokens: &[u32]) -> u64 {
        let hash = chain_hash(parent, tokens);
        if !self.cached.contains_key(&hash) && !self.keys.contains_key(&block) {
            self.cached.insert(hash, block);
            let key = Key {
                parent,
                tokens: tokens.to_vec(),
            };
            self.keys.insert(block, (hash, key));
        }
        hash
    }

    /// The cached blocks holding the longest run of `tokens`' first full blocks, at most
    /// `max_blocks`, and the key of each; each found block is now held once more.
    pub(crate) fn take_prefix(
        &mut self,
        tokens: &[u32],
        max_blocks: usize,
    ) -> (Vec<BlockId>, Vec<u64>) {
        let (mut blocks, mut hashes) = (Vec::new(), Vec::new());
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = chain_hash(parent, chunk);
            let Some(&block) = self.cached.get(&hash) else {
                break;
            };
            let same = self
                .keys
                .get(&block)
                .is_some_and(|(_, k)| k.parent == parent && k.tokens == chunk);
            if !same {
                break;
            }
            blocks.push(block);
            hashes.push(hash);
            parent = Some(hash);
        }
        for &b in &blocks {
            if let Some(t) = self.released_at.remove(&b) {
                self.evictable.remove(&t);
            }
            self.refs[b as usize] += 1;
        }
        (blocks, hashes)
    }

    /// How many of `tokens`' first full blocks (at most `max_blocks`) the cache holds,
    /// without taking them, and how many of those nothing holds now (taking them leaves
    /// fewer blocks [`BlockPool::available`]).
    pub(crate) fn cached_prefix(&self, tokens: &[u32], max_blocks: usize) -> (usize, usize) {
        let mut parent = None;
        let (mut n, mut idle) = (0, 0);
        for chunk in tokens.chunks_exact(self.block_size).take(max_blocks) {
            let hash = chain_hash(parent, chunk);
            let Some(&block) = self.cached.get(&hash) else {
                break;
            };
            let key = self.keys.get(&block);
            if !key.is_some_and(|(_, k)| k.parent == parent && k.tokens == chunk) {
                break;
            }
            n += 1;
            idle += usize::from(self.refs[block as usize] == 0);
            parent = Some(hash);
        }
        (n, idle)
    }

    /// Forgets every cached block (prefix caching turned off, or a cache made anew).
    pub(crate) fn forget_cached(&mut self) {
        self.cached.clear();
        self.keys.clear();
        self.released_at.clear();
        let evicted = std::mem::take(&mut self.evictable);
        self.free.extend(evicted.into_values());
    }

    /// Blocks holding cached prefixes that nothing holds now.
    #[cfg(test)]
    fn evictable(&self) -> usize {
        self.evictable.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blocks_are_handed_out_lowest_first_and_freed() {
        let mut pool = BlockPool::new(3, 4);
        assert_eq!((pool.total(), pool.available(), pool.used()), (3, 3, 0));
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert_eq!((a, b), (0, 1));
        pool.release(a);
        assert_eq!(pool.allocate(), Some(0));
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), None);
        assert_eq!(pool.used(), 3);
        assert_eq!(pool.blocks_for(9), 3);
    }

    #[test]
    fn a_cached_prefix_is_shared_then_evicted_least_recently_used_first() {
        let mut pool = BlockPool::new(4, 2);
        let prompt = [1, 2, 3, 4, 5];
        let (x, y) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        let h = pool.register(x, None, &prompt[0..2]);
        pool.register(y, Some(h), &prompt[2..4]);
        // Another sequence with the same first four tokens shares both blocks.
        assert_eq!(pool.cached_prefix(&[1, 2, 3, 4, 9], 8), (2, 0));
        let (blocks, hashes) = pool.take_prefix(&[1, 2, 3, 4, 9], 8);
        assert_eq!((blocks, hashes[0]), (vec![x, y], h));
        // A different first block finds nothing, even with the same second block.
        assert_eq!(pool.cached_prefix(&[7, 2, 3, 4], 8).0, 0);
        assert_eq!(pool.cached_prefix(&prompt, 1), (1, 0));
        for b in [x, y, x, y] {
            pool.release(b);
        }
        assert_eq!((pool.used(), pool.evictable(), pool.available()), (0, 2, 4));
        assert_eq!(pool.cached_prefix(&prompt, 8), (2, 2));
        // Cached blocks below the lowest free one go first, least recently released first,
        // so the blocks in use stay low; then the free ones.
        assert_eq!(pool.allocate(), Some(x));
        assert_eq!(pool.cached_prefix(&prompt, 8).0, 0, "the first was evicted");
        assert_eq!(pool.allocate(), Some(y));
        assert_eq!(pool.allocate(), Some(2));
        assert_eq!(pool.allocate(), Some(3));
        assert_eq!(pool.allocate(), None);
    }

    #[test]
    fn a_free_block_inside_the_held_span_goes_before_cached_ones() {
        let mut pool = BlockPool::new(4, 1);
        let blocks: Vec<BlockId> = (0..4).map(|_| pool.allocate().unwrap()).collect();
        pool.register(blocks[0], None, &[7]);
        pool.release(blocks[0]);
        pool.release(blocks[1]);
        // Block 3 is held, so block 1 (free) lies inside the span; cached block 0 stays.
        assert_eq!(pool.allocate(), Some(1));
        assert_eq!(pool.cached_prefix(&[7], 1), (1, 1));
    }

    #[test]
    fn a_block_computed_twice_keeps_the_first_key() {
        let mut pool = BlockPool::new(2, 2);
        let (a, b) = (pool.allocate().unwrap(), pool.allocate().unwrap());
        let ha = pool.register(a, None, &[1, 2]);
        let hb = pool.register(b, None, &[1, 2]);
        assert_eq!(ha, hb);
        pool.release(b);
        // The duplicate is free, not cached; the first stays found.
        assert_eq!(pool.evictable(), 0);
        assert_eq!(pool.take_prefix(&[1, 2], 1).0, vec![a]);
        pool.forget_cached();
        assert_eq!(pool.cached_prefix(&[1, 2], 1).0, 0);
    }
}
