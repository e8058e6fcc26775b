//! `Dims`: a list of dims (a shape, a permutation, reduced axes) held inline up to rank 6.
//!
//! Shapes and dim lists are built for every recorded op of a traced step (a decode step
//! records about 2,000); keeping them inline means neither the `Tensor` methods nor the
//! graph allocate a vector for them.

use std::hash::{Hash, Hasher};
use std::ops::{Deref, DerefMut};

/// Dims stored inline up to this rank (every op zoo records stays at rank 6 or below).
const INLINE_RANK: usize = 6;

/// A list of dims: inline up to rank 6, on the heap beyond.
#[derive(Clone)]
pub(crate) enum Dims {
    Inline { len: u8, dims: [usize; INLINE_RANK] },
    Heap(Vec<usize>),
}

impl Dims {
    pub(crate) const fn new() -> Dims {
        Dims::Inline {
            len: 0,
            dims: [0; INLINE_RANK],
        }
    }

    pub(crate) fn push(&mut self, d: usize) {
        match self {
            Dims::Inline { len, dims } if (*len as usize) < INLINE_RANK => {
                dims[*len as usize] = d;
                *len += 1;
            }
            Dims::Inline { len, dims } => {
                let mut v = dims[..*len as usize].to_vec();
                v.push(d);
                *self = Dims::Heap(v);
            }
            Dims::Heap(v) => v.push(d),
        }
    }

    /// Inserts `d` at `index` (at most the length), shifting the dims after it.
    pub(crate) fn insert(&mut self, index: usize, d: usize) {
        assert!(index <= self.len(), "Dims::insert past the end");
        self.push(d);
        self[index..].rotate_right(1);
    }

    /// Removes and returns the dim at `index`.
    pub(crate) fn remove(&mut self, index: usize) -> usize {
        let d = self[index];
        self[index..].rotate_left(1);
        match self {
            Dims::Inline { len, .. } => *len -= 1,
            Dims::Heap(v) => {
                v.pop();
            }
        }
        d
    }

    pub(crate) fn as_slice(&self) -> &[usize] {
        self
    }
}

impl Default for Dims {
    fn default() -> Dims {
        Dims::new()
    }
}

impl Deref for Dims {
    type Target = [usize];
    fn deref(&self) -> &[usize] {
        match self {
            Dims::Inline { len, dims } => &dims[..*len as usize],
            Dims::Heap(v) => v,
        }
    }
}

impl DerefMut for Dims {
    fn deref_mut(&mut self) -> &mut [usize] {
        match self {
            Dims::Inline { len, dims } => &mut dims[..*len as usize],
            Dims::Heap(v) => v,
        }
    }
}

impl From<&[usize]> for Dims {
    fn from(s: &[usize]) -> Dims {
        if s.len() <= INLINE_RANK {
            let mut dims = [0; INLINE_RANK];
            dims[..s.len()].copy_from_slice(s);
            Dims::Inline {
                len: s.len() as u8,
                dims,
            }
        } else {
            Dims::Heap(s.to_vec())
        }
    }
}

impl<const N: usize> From<[usize; N]> for Dims {
    fn from(s: [usize; N]) -> Dims {
        Dims::from(&s[..])
    }
}

impl From<Vec<usize>> for Dims {
    fn from(v: Vec<usize>) -> Dims {
        if v.len() <= INLINE_RANK {
            Dims::from(v.as_slice())
        } else {
            Dims::Heap(v)
        }
    }
}

impl Extend<usize> for Dims {
    fn extend<I: IntoIterator<Item = usize>>(&mut self, it: I) {
        for v in it {
            self.push(v);
        }
    }
}

impl FromIterator<usize> for Dims {
    fn from_iter<I: IntoIterator<Item = usize>>(it: I) -> Dims {
        let mut d = Dims::new();
        d.extend(it);
        d
    }
}

impl PartialEq for Dims {
    fn eq(&self, o: &Dims) -> bool {
        **self == **o
    }
}

impl Eq for Dims {}

impl PartialEq<[usize]> for Dims {
    fn eq(&self, o: &[usize]) -> bool {
        **self == *o
    }
}

/// Hashes as the slice of dims (as a `Vec<usize>` would), whatever the storage.
impl Hash for Dims {
    fn hash<H: Hasher>(&self, h: &mut H) {
        (**self).hash(h)
    }
}

impl std::fmt::Debug for Dims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        (**self).fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dims_spill_past_rank_six() {
        let mut d = Dims::from(&[1, 2, 3, 4, 5, 6][..]);
        assert!(matches!(d, Dims::Inline { .. }));
        d.push(7);
        assert!(matches!(d, Dims::Heap(_)));
        assert_eq!(&d[..], &[1, 2, 3, 4, 5, 6, 7]);
        assert_eq!(d, Dims::from(vec![1, 2, 3, 4, 5, 6, 7]));
        assert_eq!(&(0..3).collect::<Dims>()[..], &[0, 1, 2]);
    }

    #[test]
    fn insert_and_remove_shift_like_vec() {
        for n in [0, 3, 6, 8] {
            let base: Vec<usize> = (10..10 + n).collect();
            for i in 0..=n {
                let (mut d, mut v) = (Dims::from(base.as_slice()), base.clone());
                d.insert(i, 1);
                v.insert(i, 1);
                assert_eq!(d, Dims::from(v.clone()));
                assert_eq!(d.remove(i), v.remove(i));
                assert_eq!(d, Dims::from(v));
            }
        }
    }

    #[test]
    fn hashes_like_a_vec() {
        use std::collections::hash_map::DefaultHasher;
        let h = |x: &dyn Fn(&mut DefaultHasher)| {
            let mut s = DefaultHasher::new();
            x(&mut s);
            s.finish()
        };
        for v in [vec![], vec![2, 3], (0..9).collect::<Vec<usize>>()] {
            let d = Dims::from(v.as_slice());
            assert_eq!(h(&|s| d.hash(s)), h(&|s| v.hash(s)));
        }
    }
}
