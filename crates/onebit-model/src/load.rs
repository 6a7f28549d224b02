//! Opening a model path: a `.gguf` file (or, later, a pack directory) becomes
//! semantics, weights and a runnable `Model`.

use std::path::Path;

use onebit_formats::gguf::Gguf;

use crate::error::{ModelError, Result};
use crate::families;
use crate::forward::{ExecConfig, Model};
use crate::semantics::Semantics;
use crate::weights;

/// An opened container: its semantics, before weights are loaded.
pub struct Opened {
    pub gguf: Gguf,
    pub sem: Semantics,
}

pub fn open(path: &Path) -> Result<Opened> {
    if path.is_dir() {
        return Err(ModelError::Unsupported {
            path: path.to_path_buf(),
            what: "is a directory; FastFlowLM pack directories are not readable yet (give a .gguf file)".into(),
        });
    }
    let gguf = Gguf::open(path)?;
    let sem = families::semantics_from_gguf(&gguf)?;
    Ok(Opened { gguf, sem })
}

impl Opened {
    pub fn into_model(self, exec: &ExecConfig) -> Result<Model> {
        let w = weights::load(&self.gguf, &self.sem)?;
        Ok(Model::new(self.sem, w, exec))
    }
}

/// Opens and loads in one step.
pub fn load(path: &Path, exec: &ExecConfig) -> Result<(Model, Gguf)> {
    let o = open(path)?;
    let w = weights::load(&o.gguf, &o.sem)?;
    Ok((Model::new(o.sem, w, exec), o.gguf))
}
