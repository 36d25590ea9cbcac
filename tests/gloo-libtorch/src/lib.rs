//! Proves that one process can use Debian's Gloo (through
//! `compiler-collectives-gloo`, loaded with `RTLD_DEEPBIND`) and libtorch's
//! c10d `ProcessGroupGloo` (linked normally, with its own copy of Gloo's
//! symbols), in either order.
//!
//! Needs libtorch: build after `eval "$(scripts/setup-torch.sh)"`.

use std::ffi::{c_char, c_int};

extern "C" {
    fn ccol_c10d_gloo_allreduce(
        world: c_int,
        sums: *mut f64,
        err: *mut c_char,
        err_len: usize,
    ) -> c_int;
}

/// Runs `world` c10d ProcessGroupGloo ranks as threads of this process; each
/// allreduces (sums) a 4-element tensor filled with `rank + 1`, and returns
/// the sum of its result: `4 · world·(world+1)/2` on every rank.
///
/// # Errors
/// libtorch's exception text.
pub fn c10d_gloo_allreduce(world: u32) -> Result<Vec<f64>, String> {
    let w = c_int::try_from(world).map_err(|_| "world too large".to_string())?;
    let mut sums = vec![0f64; world as usize];
    let mut err = vec![0 as c_char; 1024];
    // SAFETY: `sums` holds `world` doubles and `err` 1024 bytes, both alive for
    // the call; the shim catches every C++ exception.
    let rc = unsafe { ccol_c10d_gloo_allreduce(w, sums.as_mut_ptr(), err.as_mut_ptr(), err.len()) };
    if rc == 0 {
        Ok(sums)
    } else {
        let bytes: Vec<u8> = err
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| c.to_ne_bytes()[0])
            .collect();
        Err(String::from_utf8_lossy(&bytes).into_owned())
    }
}
