//! The file `synth --save` writes: a trace appears whole or not at all, and a file already at
//! that path is lost only to a complete trace.
//!
//! A regular file (or a path where nothing is yet) is written as a hidden temporary file in the
//! same folder and renamed over the path once the trace is complete, so a failure — a full
//! disk, a file-size limit — leaves what was there as it was. A path that names something
//! else, such as `/dev/null` or a named pipe, is written in place and never removed; so is a
//! file in a folder where no new file may be made.

use std::fs::{self, File, Permissions};
use std::io;
use std::path::{Path, PathBuf};
use tempfile::NamedTempFile;

/// Where a trace is being written.
pub enum SaveFile {
    /// A temporary file that becomes `path` when committed; dropped, it is removed.
    Replacing {
        temp: NamedTempFile,
        path: PathBuf,
        /// Whether a file was there before (a failure's message says it is unchanged).
        existed: bool,
    },
    /// Not a regular file (or a file in a folder that takes no new one): written in place.
    InPlace(File),
}

impl SaveFile {
    /// Open the place the trace for `path` is written to.
    pub fn create(path: &Path) -> io::Result<SaveFile> {
        match fs::metadata(path) {
            Ok(meta) if meta.is_file() => {
                // Through a link, the file it names is replaced, as writing to it would.
                let path = fs::canonicalize(path)?;
                let temp = match temp_beside(&path, meta.permissions()) {
                    Ok(temp) => temp,
                    // A folder that takes no new file, holding a file that may be written.
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                        return File::create(&path).map(SaveFile::InPlace);
                    }
                    Err(e) => return Err(e),
                };
                // The creation mode was narrowed by the umask; the file keeps its own exactly.
                temp.as_file().set_permissions(meta.permissions())?;
                Ok(SaveFile::Replacing {
                    temp,
                    path,
                    existed: true,
                })
            }
            Ok(_) => File::create(path).map(SaveFile::InPlace),
            Err(e) if e.kind() == io::ErrorKind::NotFound && !is_link(path) => {
                use std::os::unix::fs::PermissionsExt;
                // What a new file gets, less the process's umask.
                let temp = temp_beside(path, Permissions::from_mode(0o666))?;
                Ok(SaveFile::Replacing {
                    temp,
                    path: path.to_path_buf(),
                    existed: false,
                })
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                File::create(path).map(SaveFile::InPlace)
            }
            Err(e) => Err(e),
        }
    }

    /// A handle the trace is written through.
    pub fn writer(&self) -> io::Result<File> {
        match self {
            SaveFile::Replacing { temp, .. } => temp.as_file().try_clone(),
            SaveFile::InPlace(file) => file.try_clone(),
        }
    }

    /// Whether a failure leaves a file that was at the path as it was.
    pub fn keeps_previous(&self) -> bool {
        matches!(self, SaveFile::Replacing { existed: true, .. })
    }

    /// The trace is complete: put it at its path.
    pub fn commit(self) -> io::Result<()> {
        match self {
            SaveFile::Replacing { temp, path, .. } => {
                temp.persist(&path).map(drop).map_err(|e| e.error)
            }
            SaveFile::InPlace(_) => Ok(()),
        }
    }
}

/// A hidden temporary file in `path`'s folder, created with `permissions` (less the umask).
fn temp_beside(path: &Path, permissions: Permissions) -> io::Result<NamedTempFile> {
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    // A missing folder is named as writing the path itself would name it.
    fs::metadata(dir)?;
    tempfile::Builder::new()
        .prefix(".cachealloc-save-")
        .suffix(".part")
        .permissions(permissions)
        .tempfile_in(dir)
        .map_err(|e| {
            let kind = e.kind();
            io::Error::new(
                kind,
                format!("cannot create a file in {}: {kind}", dir.display()),
            )
        })
}

fn is_link(path: &Path) -> bool {
    fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink())
}

/// Which of the process's standard streams `path` names, however it is spelled (`/dev/stdout`,
/// `/proc/self/fd/1`, the file standard output is redirected to), said as a refusal's reason.
/// A device other than a terminal (`/dev/null`) may be both: nothing there is read.
pub fn standard_stream(path: &Path) -> Option<&'static str> {
    use std::io::IsTerminal;
    use std::os::fd::AsFd;
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let target = fs::metadata(path).ok()?;
    let same = |fd: std::os::fd::BorrowedFd<'_>, terminal: bool| {
        let stream = File::from(fd.try_clone_to_owned().ok()?).metadata().ok()?;
        let shared = stream.dev() == target.dev() && stream.ino() == target.ino();
        Some(shared && (terminal || !target.file_type().is_char_device()))
    };
    let (out, err) = (std::io::stdout(), std::io::stderr());
    if same(out.as_fd(), out.is_terminal()) == Some(true) {
        Some("standard output, where the summary goes")
    } else if same(err.as_fd(), err.is_terminal()) == Some(true) {
        Some("standard error, where the notes go")
    } else {
        None
    }
}
