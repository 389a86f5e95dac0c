//! The file system's free space, for the broker's full-disk threshold
//! (`broker/src/shard/disk.rs`) and the journal's zero-filled spare files
//! (`journal::Journal::prepare_spare`).

use std::path::Path;

/// The file system holding `dir`: (bytes available to unprivileged
/// writers, size).
pub fn statvfs(dir: &Path) -> std::io::Result<(u64, u64)> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes())
        .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::zeroed();
    // SAFETY: `path` is a NUL-terminated string and `st` room for one
    // `statvfs`, which the call fills when it returns 0.
    if unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: filled by the successful call above.
    let st = unsafe { st.assume_init() };
    // The fields' C types are 64 bits here, narrower on some platforms.
    #[allow(clippy::unnecessary_cast)]
    let (block, available, blocks) = (st.f_frsize as u64, st.f_bavail as u64, st.f_blocks as u64);
    Ok((available * block, blocks * block))
}
