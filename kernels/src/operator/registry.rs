//! The operators registered in this process, so that a `Copy` handle ([`UserOp`], carried by `ReduceOp::User`)
//! names one. Each is checked against a data type and compiled for it once, on first use, and kept until the process
//! ends (a process registers a handful: the ones its `.coll` files define).

use std::sync::{Mutex, OnceLock};

use thiserror::Error;

use super::native::Native;
use super::{NotReorderable, Operator, TypeError, Typed};
use crate::DataType;

/// A registered operator: an index into this process's registry. Ranks of one job agree on an operator by its
/// [`UserOp::digest`], never by this index.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct UserOp(u16);

/// How many distinct operators one process may register.
pub const CAPACITY: usize = 1024;

/// The registry is full.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("cannot register `{name}`: this process already holds {CAPACITY} operators")]
pub struct RegistryFull {
    pub name: String,
}

struct Entry {
    operator: Operator,
    digest: u64,
    per_dtype: [OnceLock<Result<Prepared, TypeError>>; DataType::ALL.len()],
}

/// An operator ready for one data type: checked, and compiled (or, where cranelift failed, evaluated).
pub struct Prepared {
    pub typed: Typed,
    pub native: Result<Native, String>,
    reorderable: OnceLock<Result<(), NotReorderable>>,
}

static ENTRIES: [OnceLock<Entry>; CAPACITY] = [const { OnceLock::new() }; CAPACITY];
static REGISTERED: Mutex<usize> = Mutex::new(0);

impl UserOp {
    /// `operator`'s handle: the one it already has if an operator of the same name and body is registered.
    pub fn register(operator: Operator) -> Result<UserOp, RegistryFull> {
        let digest = operator.digest();
        let mut registered = REGISTERED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        let same = |e: &Entry| e.digest == digest && e.operator.name == operator.name;
        if let Some(k) = (0..*registered).find(|&k| ENTRIES[k].get().is_some_and(same)) {
            return Ok(UserOp(k as u16));
        }
        if *registered == CAPACITY {
            return Err(RegistryFull { name: operator.name });
        }
        let k = *registered;
        let entry = Entry { operator, digest, per_dtype: [const { OnceLock::new() }; DataType::ALL.len()] };
        assert!(ENTRIES[k].set(entry).is_ok(), "slots past the count are empty");
        *registered += 1;
        Ok(UserOp(k as u16))
    }

    /// The operator registered last under `name`.
    pub fn named(name: &str) -> Option<UserOp> {
        let registered = *REGISTERED.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        (0..registered)
            .rev()
            .find(|&k| ENTRIES[k].get().is_some_and(|e| e.operator.name == name))
            .map(|k| UserOp(k as u16))
    }

    /// The handle's index in this process's registry (the device image carries it to the twin).
    pub fn index(self) -> u16 {
        self.0
    }

    /// The handle at `index`, if an operator is registered there.
    pub fn from_index(index: u64) -> Option<UserOp> {
        let k = usize::try_from(index).ok().filter(|&k| k < CAPACITY)?;
        ENTRIES[k].get().map(|_| UserOp(k as u16))
    }

    fn entry(self) -> &'static Entry {
        ENTRIES[usize::from(self.0)].get().expect("a handle is made only by registering")
    }

    pub fn operator(self) -> &'static Operator {
        &self.entry().operator
    }

    pub fn name(self) -> &'static str {
        &self.entry().operator.name
    }

    /// The operator's name and body, hashed: what ranks compare to know they run one operator.
    pub fn digest(self) -> u64 {
        self.entry().digest
    }

    /// The operator for `dtype`: checked and compiled on first use, or why it does not type.
    pub fn prepare(self, dtype: DataType) -> Result<&'static Prepared, &'static TypeError> {
        let entry = self.entry();
        let slot = &entry.per_dtype[usize::from(dtype.nccl_code())];
        slot.get_or_init(|| {
            let typed = entry.operator.check(dtype)?;
            let native = typed.compile();
            Ok(Prepared { typed, native, reorderable: OnceLock::new() })
        })
        .as_ref()
    }

    /// `dst[i] = a[i] (op) b[i]` for `n` elements.
    ///
    /// # Safety
    /// As `host::reduce`; and the operator must type for `dtype` (`prepare` said so), else this panics.
    pub unsafe fn reduce(self, dtype: DataType, dst: *mut u8, a: *const u8, b: *const u8, n: usize) {
        let prepared =
            self.prepare(dtype).unwrap_or_else(|e| panic!("`{}` on {dtype} was not prepared: {e}", self.name()));
        match prepared.native {
            // SAFETY: forwarded from the caller; the kernel reads and writes `n` elements of `dtype`.
            Ok(native) => unsafe { (native.kernel)(dst, a, b, n) },
            Err(_) => {
                let size = dtype.size_bytes();
                let mut out = [0u8; 8];
                for k in 0..n {
                    // SAFETY: element k of each buffer is inside it (caller's contract); `dst` may be `a` or `b`,
                    // and each element is read whole before it is written.
                    unsafe {
                        let (x, y) = (
                            std::slice::from_raw_parts(a.add(k * size), size),
                            std::slice::from_raw_parts(b.add(k * size), size),
                        );
                        prepared.typed.eval(x, y, &mut out[..size]);
                        std::ptr::copy_nonoverlapping(out.as_ptr(), dst.add(k * size), size);
                    }
                }
            }
        }
    }
}

impl Prepared {
    /// Whether an algorithm may reduce in another order than a chain in rank order (computed once).
    pub fn reorderable(&self) -> Result<(), &NotReorderable> {
        self.reorderable.get_or_init(|| self.typed.reorderable()).as_ref().map(|_| ())
    }
}
