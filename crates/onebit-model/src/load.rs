//! Opening a model path: a `.gguf` file or a pack directory becomes a
//! container (tensors by GGUF name), semantics, and then a runnable `Model`.

use std::path::Path;

use onebit_formats::gguf::Gguf;

use crate::error::{ModelError, Result};
use crate::families;
use crate::forward::{context_limit, ExecConfig, Model};
use crate::pack::Pack;
use crate::semantics::{LayerKind, Semantics};
use crate::weights::{self, TensorSource};

/// The container a model path names. One per model, so the size of the
/// unboxed GGUF variant costs nothing worth an indirection.
#[allow(clippy::large_enum_variant)]
pub enum Container {
    Gguf(Gguf),
    /// A FastFlowLM pack directory.
    Pack(Box<Pack>),
}

impl Container {
    pub fn tensors(&self) -> &dyn TensorSource {
        match self {
            Container::Gguf(g) => g,
            Container::Pack(p) => p.as_ref(),
        }
    }
}

/// An opened model path: its container and semantics, before weights load.
pub struct Opened {
    pub container: Container,
    pub sem: Semantics,
}

pub fn open(path: &Path) -> Result<Opened> {
    if path.is_dir() {
        if !Pack::is_pack(path) {
            return Err(ModelError::Unsupported {
                path: path.to_path_buf(),
                what: format!(
                    "is a directory without {}; a model path is a .gguf file or a FastFlowLM pack directory",
                    crate::pack::WEIGHTS
                ),
            });
        }
        let pack = Pack::open(path)?;
        let sem = pack.semantics()?;
        return Ok(Opened {
            container: Container::Pack(Box::new(pack)),
            sem,
        });
    }
    // A single file, or the first part of a split GGUF with its other
    // parts beside it (llama.cpp's gguf-split), read as one.
    let gguf = Gguf::open_all(path)?;
    let sem = families::semantics_from_gguf(&gguf)?;
    Ok(Opened {
        container: Container::Gguf(gguf),
        sem,
    })
}

impl Opened {
    /// The model path: the GGUF file or the pack directory.
    pub fn path(&self) -> &Path {
        match &self.container {
            Container::Gguf(g) => g.path(),
            Container::Pack(p) => p.dir(),
        }
    }

    /// Loads the weights the semantics name.
    pub fn load(&self, exec: &ExecConfig) -> Result<Model> {
        self.load_reporting(exec, &mut |_, _| {})
    }

    /// [`load`](Self::load), reporting the preparation of the weights as
    /// `progress(done, total)` in bytes (see [`Model::new_reporting`]).
    pub fn load_reporting(
        &self,
        exec: &ExecConfig,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<Model> {
        let (sk, sv) = self.sem.head_dims(LayerKind::Sliding);
        let d = &self.sem.dims;
        for dim in [d.head_dim_k, d.head_dim_v, sk, sv] {
            if let Err(what) = exec.kv_type.check_head_dim(dim) {
                return Err(ModelError::Unsupported {
                    path: self.path().to_path_buf(),
                    what,
                });
            }
        }
        // The tables this run uses (LongRoPE's short or long one).
        let sem = self.sem.at_context(context_limit(exec, &self.sem));
        let w = weights::load(self.container.tensors(), &sem)?;
        let model = Model::new_reporting(sem, w, exec, progress);
        // Preparing each matrix read its neighbours' edges too (read-around);
        // now that every prepared copy exists, drop those pages again.
        for m in model.weights.matrices() {
            m.release_original();
        }
        Ok(model)
    }
}

/// Opens and loads in one step.
pub fn load(path: &Path, exec: &ExecConfig) -> Result<(Model, Opened)> {
    let o = open(path)?;
    let m = o.load(exec)?;
    Ok((m, o))
}
